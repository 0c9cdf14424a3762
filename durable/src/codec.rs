//! How durable records are laid out inside the embedded store's values.
//!
//! fjall gives us atomic, checksummed, crash-safe batches of key-value pairs;
//! this module only decides what the keys and values say. Every integer is
//! fixed-width (big-endian in keys, so that keys sort numerically;
//! little-endian in values). A value that does not decode is reported as
//! corrupt with what was expected, never unwrapped.
//!
//! Partitions (one set per generation `g`, so that `/clear` drops two
//! partitions instead of deleting keys one by one):
//!
//! - `meta`: `generation` → `u64`, the current generation.
//! - `log_{g}`: batch number (`u64`) → the records of one writer batch, in the
//!   order they were recorded: `1 rank num_pages` (initialize), `2 rank page
//!   world key` (bind), `3 rank page` (unbind).
//!   Since reservations are durable, also `4 rank page tag` (reserve: the page is reserved
//!   for the key with that tag, [`crate::core::KeyRef::tag`]) and `5 rank
//!   page` (hold: unbound, held back for a reader's lease); `3 rank page`
//!   (unbind) then means "the page is free", whatever it was. A log written
//!   before has no 4 or 5 and reads the same.
//! - `state_{g}`: the checkpointed state. `R rank` → `num_pages`;
//!   `C chunk rank` → the bindings of pages `chunk * 256 ..` on that rank, as
//!   sorted `offset world key` entries. Chunk-major order lets recovery
//!   restore every rank's page `p` together, which keeps each key's index
//!   entry hot while it gets its bindings. Since state format 2,
//!   `P chunk rank` → the pending pages of that chunk, reserved or held, as
//!   sorted `offset kind tag` entries (`kind` 1 reserved, 2 held, whose
//!   `tag` is 0). A state written before (format 1) has no `P` keys, and
//!   loads as a state with no pending page.
//!
//! A key is `0` + its 16 digest bytes, `2` + its 32 digest bytes + a `u8`
//! length + its suffix text (an SGLang key), or `1` + a `u32` length + its
//! UTF-8 text (see [`crate::core::Key`]). A digest key's suffix is written as
//! text, never as the process's pool id, which another process may number
//! differently.

use crate::core::{Key, KeyRef};
use std::fmt;

/// Pages per state chunk: `page >> CHUNK_SHIFT` is the chunk.
pub(crate) const CHUNK_SHIFT: u32 = 8;
/// Offsets within a chunk are below this.
pub(crate) const CHUNK_PAGES: u32 = 1 << CHUNK_SHIFT;

/// A state chunk: `rank << 32 | chunk`.
pub(crate) fn chunk_id(rank: u32, chunk: u32) -> u64 {
    (u64::from(rank) << 32) | u64::from(chunk)
}

/// The `meta` key holding the current generation.
pub(crate) const GENERATION_KEY: &[u8] = b"generation";
/// Prefix of rank keys in a state partition.
pub(crate) const RANK_PREFIX: u8 = b'R';
/// Prefix of chunk keys in a state partition.
pub(crate) const CHUNK_PREFIX: u8 = b'C';
/// Prefix of pending-page chunk keys in a state partition (format 2).
pub(crate) const PENDING_PREFIX: u8 = b'P';

const TAG_INIT: u8 = 1;
const TAG_BIND: u8 = 2;
const TAG_UNBIND: u8 = 3;
const TAG_RESERVE: u8 = 4;
const TAG_HOLD: u8 = 5;
const PENDING_RESERVED: u8 = 1;
const PENDING_HELD: u8 = 2;
const KEY_HEX: u8 = 0;
const KEY_TEXT: u8 = 1;
const KEY_DIGEST: u8 = 2;

/// Bytes [`key_str`] may need: 64 hex digits and the longest suffix.
pub const KEY_BUF: usize = 64 + 1 + crate::core::key::MAX_POOL_LEN;

/// The log partition of generation `g`.
pub fn log_partition(g: u64) -> String {
    format!("log_{g}")
}

/// The state partition of generation `g`.
pub(crate) fn state_partition(g: u64) -> String {
    format!("state_{g}")
}

/// The generation a `log_{g}` or `state_{g}` partition belongs to.
pub(crate) fn partition_generation(name: &str) -> Option<u64> {
    name.strip_prefix("log_").or_else(|| name.strip_prefix("state_")).and_then(|g| g.parse().ok())
}

/// A log key: the writer's batch number.
pub fn log_key(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

/// The key of rank `rank`'s size in a state partition.
pub(crate) fn rank_key(rank: u32) -> [u8; 5] {
    let mut k = [RANK_PREFIX; 5];
    k[1..].copy_from_slice(&rank.to_be_bytes());
    k
}

/// The key of chunk `chunk` of rank `rank` in a state partition.
pub(crate) fn chunk_key(chunk: u32, rank: u32) -> [u8; 9] {
    let mut k = [CHUNK_PREFIX; 9];
    k[1..5].copy_from_slice(&chunk.to_be_bytes());
    k[5..].copy_from_slice(&rank.to_be_bytes());
    k
}

/// The key of the pending pages of chunk `chunk` of rank `rank`.
pub(crate) fn pending_key(chunk: u32, rank: u32) -> [u8; 9] {
    let mut k = chunk_key(chunk, rank);
    k[0] = PENDING_PREFIX;
    k
}

/// Splits a chunk key (either kind) into `(chunk, rank)`.
pub(crate) fn parse_chunk_key(k: &[u8]) -> Result<(u32, u32), Corrupt> {
    match k {
        [CHUNK_PREFIX | PENDING_PREFIX, rest @ ..] if rest.len() == 8 => Ok((be32(&rest[..4]), be32(&rest[4..]))),
        _ => Err(Corrupt::new("a state chunk key", k.len())),
    }
}

/// A page that is neither free nor bound, as the journal and the state
/// keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// Reserved for the key with this tag.
    Reserved(u32),
    /// Held back for a reader's lease.
    Held,
}

/// Encodes a pending chunk: `entries` sorted by offset.
pub(crate) fn encode_pending(entries: &[(u16, Pending)], out: &mut Vec<u8>) {
    out.clear();
    for &(off, p) in entries {
        out.extend_from_slice(&off.to_le_bytes());
        let (kind, tag) = match p {
            Pending::Reserved(t) => (PENDING_RESERVED, t),
            Pending::Held => (PENDING_HELD, 0),
        };
        out.push(kind);
        out.extend_from_slice(&tag.to_le_bytes());
    }
}

/// Decodes a pending chunk, checking offsets as [`decode_chunk`] does.
pub(crate) fn decode_pending(buf: &[u8], out: &mut Vec<(u16, Pending)>) -> Result<(), Corrupt> {
    out.clear();
    let mut r = Reader { buf, pos: 0, what: "pending chunk" };
    while !r.done() {
        let at = r.pos;
        let off = r.u16()?;
        if u32::from(off) >= CHUNK_PAGES || out.last().is_some_and(|(o, _)| *o >= off) {
            return Err(Corrupt::new("pending chunk (page offsets out of order)", at));
        }
        let at = r.pos;
        let p = match (r.u8()?, r.u32()?) {
            (PENDING_RESERVED, tag) => Pending::Reserved(tag),
            (PENDING_HELD, 0) => Pending::Held,
            _ => return Err(Corrupt::new("pending chunk (kind)", at)),
        };
        out.push((off, p));
    }
    Ok(())
}

/// Parses a rank key and its value into `(rank, num_pages)`.
pub(crate) fn parse_rank(k: &[u8], v: &[u8]) -> Result<(u32, u32), Corrupt> {
    match (k, v) {
        ([RANK_PREFIX, rest @ ..], _) if rest.len() == 4 && v.len() == 4 => Ok((be32(rest), le32(v))),
        _ => Err(Corrupt::new("a state rank entry", k.len())),
    }
}

fn be32(b: &[u8]) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(b);
    u32::from_be_bytes(a)
}

#[inline]
fn le32(b: &[u8]) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(b);
    u32::from_le_bytes(a)
}

/// A value that does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    /// What was being decoded.
    pub what: &'static str,
    /// The byte offset where decoding failed.
    pub at: usize,
}

impl Corrupt {
    fn new(what: &'static str, at: usize) -> Self {
        Self { what, at }
    }
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corrupt {} at byte {}", self.what, self.at)
    }
}

/// A binding as stored: the key and its world size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The key's world size.
    pub world: u32,
    /// The key.
    pub key: Key,
}

/// One decoded log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A rank was created.
    Initialize {
        /// The rank.
        rank: u32,
        /// Its size.
        num_pages: u32,
    },
    /// A page was bound.
    Bind {
        /// The rank.
        rank: u32,
        /// The page.
        page: u32,
        /// What it is bound to.
        binding: Binding,
    },
    /// A page became free (its binding, reservation or hold ended).
    Unbind {
        /// The rank.
        rank: u32,
        /// The page.
        page: u32,
    },
    /// A page was reserved, or held.
    Pending {
        /// The rank.
        rank: u32,
        /// The page.
        page: u32,
        /// How.
        pending: Pending,
    },
}

/// Appends an initialize record.
pub fn put_initialize(out: &mut Vec<u8>, rank: u32, num_pages: u32) {
    out.push(TAG_INIT);
    out.extend_from_slice(&rank.to_le_bytes());
    out.extend_from_slice(&num_pages.to_le_bytes());
}

/// Appends a bind record.
pub fn put_bind(out: &mut Vec<u8>, rank: u32, page: u32, world: u32, key: KeyRef<'_>) {
    if let KeyRef::Hex(v) = key {
        // The common record in one piece: tag, three u32s, a hex key.
        let mut rec = [0u8; 1 + 12 + 1 + 16];
        rec[0] = TAG_BIND;
        rec[1..5].copy_from_slice(&rank.to_le_bytes());
        rec[5..9].copy_from_slice(&page.to_le_bytes());
        rec[9..13].copy_from_slice(&world.to_le_bytes());
        rec[13] = KEY_HEX;
        rec[14..].copy_from_slice(&v.to_be_bytes());
        out.extend_from_slice(&rec);
        return;
    }
    out.extend_from_slice(&fixed(TAG_BIND, [rank, page, world]));
    put_key(out, key);
}

/// A record's tag and three `u32`s.
#[inline]
fn fixed(tag: u8, v: [u32; 3]) -> [u8; 13] {
    let mut rec = [tag; 13];
    for (i, x) in v.iter().enumerate() {
        rec[1 + 4 * i..5 + 4 * i].copy_from_slice(&x.to_le_bytes());
    }
    rec
}

/// A record's tag and two `u32`s.
#[inline]
fn pair(tag: u8, a: u32, b: u32) -> [u8; 9] {
    let mut rec = [tag; 9];
    rec[1..5].copy_from_slice(&a.to_le_bytes());
    rec[5..].copy_from_slice(&b.to_le_bytes());
    rec
}

/// Appends an unbind record.
pub fn put_unbind(out: &mut Vec<u8>, rank: u32, page: u32) {
    out.extend_from_slice(&pair(TAG_UNBIND, rank, page));
}

/// Appends a reserve record (the page is reserved for the key tagged `tag`).
pub fn put_reserve(out: &mut Vec<u8>, rank: u32, page: u32, tag: u32) {
    out.extend_from_slice(&fixed(TAG_RESERVE, [rank, page, tag]));
}

/// Appends a hold record (the page is held back for a reader's lease).
pub fn put_hold(out: &mut Vec<u8>, rank: u32, page: u32) {
    out.extend_from_slice(&pair(TAG_HOLD, rank, page));
}

fn put_key(out: &mut Vec<u8>, key: KeyRef<'_>) {
    match key {
        KeyRef::Hex(v) => {
            out.push(KEY_HEX);
            out.extend_from_slice(&v.to_be_bytes());
        }
        KeyRef::Digest(d) => {
            out.push(KEY_DIGEST);
            out.extend_from_slice(&d.bytes);
            let mut buf = [0u8; KEY_BUF];
            let suffix = &digest_str(&d, &mut buf)[64..];
            out.push(suffix.len() as u8);
            out.extend_from_slice(suffix.as_bytes());
        }
        KeyRef::Text(s) => {
            out.push(KEY_TEXT);
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
    }
}

/// Writes `bytes` as lowercase hex into `out` (twice as long).
fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in bytes.iter().enumerate() {
        out[2 * i] = HEX[usize::from(byte >> 4)];
        out[2 * i + 1] = HEX[usize::from(byte & 15)];
    }
}

/// A digest key as the client sent it, written into `buf`.
fn digest_str<'a>(d: &crate::core::key::Digest, buf: &'a mut [u8; KEY_BUF]) -> &'a str {
    use std::io::Write as _;
    hex_into(&d.bytes, &mut buf[..64]);
    let mut rest = &mut buf[64..];
    let room = rest.len();
    // The suffix is at most `MAX_POOL_LEN + 1` bytes: it fits.
    let _ = write!(rest, "{}", &d.to_string()[64..]);
    let len = 64 + room - rest.len();
    // Only ASCII hex digits and the suffix's UTF-8 were written.
    std::str::from_utf8(&buf[..len]).unwrap_or_default()
}

/// A cursor over a value.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    #[inline]
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], Corrupt> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or(Corrupt::new(self.what, self.pos))?;
        let b = &self.buf[self.pos..end];
        self.pos = end;
        Ok(b)
    }

    #[inline]
    fn u8(&mut self) -> Result<u8, Corrupt> {
        Ok(self.bytes(1)?[0])
    }

    #[inline]
    fn u16(&mut self) -> Result<u16, Corrupt> {
        let b = self.bytes(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    #[inline]
    fn u32(&mut self) -> Result<u32, Corrupt> {
        Ok(le32(self.bytes(4)?))
    }

    fn key(&mut self) -> Result<Key, Corrupt> {
        let at = self.pos;
        match self.u8()? {
            KEY_HEX => {
                let mut b = [0u8; 16];
                b.copy_from_slice(self.bytes(16)?);
                // The all-zero digest is always stored as text (see core::key).
                if b == [0; 16] {
                    return Err(Corrupt::new(self.what, at));
                }
                Ok(Key::Hex(b))
            }
            KEY_TEXT => {
                let n = self.u32()? as usize;
                let at = self.pos;
                let s = std::str::from_utf8(self.bytes(n)?).map_err(|_| Corrupt::new(self.what, at))?;
                Ok(Key::Text(s.into()))
            }
            KEY_DIGEST => {
                let mut text = [0u8; 64];
                hex_into(self.bytes(32)?, &mut text);
                let n = usize::from(self.u8()?);
                let at = self.pos;
                let suffix = std::str::from_utf8(self.bytes(n)?).map_err(|_| Corrupt::new(self.what, at))?;
                let s = format!("{}{suffix}", std::str::from_utf8(&text).unwrap_or_default());
                // Parsed again, so that the pool gets this process's id (or,
                // with the pool table full, the key is text: the same string).
                match KeyRef::parse(&s) {
                    KeyRef::Text(_) if suffix.is_empty() || suffix == "-k" || suffix == "-v" => {
                        Err(Corrupt::new(self.what, at))
                    }
                    k => Ok(k.to_key()),
                }
            }
            _ => Err(Corrupt::new(self.what, at)),
        }
    }

    #[inline]
    fn done(&self) -> bool {
        self.pos == self.buf.len()
    }
}

/// Decodes every record of one log entry, in order.
pub fn decode_log(buf: &[u8], mut each: impl FnMut(Record)) -> Result<(), Corrupt> {
    let mut r = Reader { buf, pos: 0, what: "log record" };
    while !r.done() {
        let at = r.pos;
        let rec = match r.u8()? {
            TAG_INIT => Record::Initialize { rank: r.u32()?, num_pages: r.u32()? },
            TAG_BIND => {
                let (rank, page, world) = (r.u32()?, r.u32()?, r.u32()?);
                Record::Bind { rank, page, binding: Binding { world, key: r.key()? } }
            }
            TAG_UNBIND => Record::Unbind { rank: r.u32()?, page: r.u32()? },
            TAG_RESERVE => {
                let (rank, page, tag) = (r.u32()?, r.u32()?, r.u32()?);
                Record::Pending { rank, page, pending: Pending::Reserved(tag) }
            }
            TAG_HOLD => Record::Pending { rank: r.u32()?, page: r.u32()?, pending: Pending::Held },
            _ => return Err(Corrupt::new("log record tag", at)),
        };
        each(rec);
    }
    Ok(())
}

/// Encodes a chunk: `entries` sorted by offset, each offset below [`CHUNK_PAGES`].
pub(crate) fn encode_chunk(entries: &[(u16, Binding)], out: &mut Vec<u8>) {
    out.clear();
    for (off, b) in entries {
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&b.world.to_le_bytes());
        put_key(out, b.key.as_ref());
    }
}

/// Decodes a chunk into `(offset, binding)` entries, checking that offsets
/// are in range and strictly increasing.
pub(crate) fn decode_chunk(buf: &[u8], out: &mut Vec<(u16, Binding)>) -> Result<(), Corrupt> {
    out.clear();
    let mut r = Reader { buf, pos: 0, what: "state chunk" };
    while !r.done() {
        let at = r.pos;
        let off = r.u16()?;
        if u32::from(off) >= CHUNK_PAGES || out.last().is_some_and(|(o, _)| *o >= off) {
            return Err(Corrupt::new("state chunk (page offsets out of order)", at));
        }
        let world = r.u32()?;
        out.push((off, Binding { world, key: r.key()? }));
    }
    Ok(())
}

/// Writes `key` as the string a client sent, into `buf` when it is a digest.
pub fn key_str<'a>(key: &'a Key, buf: &'a mut [u8; KEY_BUF]) -> &'a str {
    match key {
        Key::Hex(b) => {
            hex_into(b, &mut buf[..32]);
            // Only ASCII hex digits were written.
            std::str::from_utf8(&buf[..32]).unwrap_or_default()
        }
        Key::Digest(d) => digest_str(d, buf),
        Key::Text(s) => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MD5: &str = "0123456789abcdef0123456789abcdef";
    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn log_round_trips() {
        let mut buf = Vec::new();
        put_initialize(&mut buf, 3, 1000);
        put_bind(&mut buf, 3, 7, 2, KeyRef::parse(MD5));
        put_bind(&mut buf, 3, 8, 2, KeyRef::parse("text ключ"));
        put_unbind(&mut buf, 3, 7);
        let mut got = Vec::new();
        decode_log(&buf, |r| got.push(r)).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], Record::Initialize { rank: 3, num_pages: 1000 });
        match &got[1] {
            Record::Bind { binding, .. } => assert_eq!(binding.key.to_string(), MD5),
            r => panic!("{r:?}"),
        }
        match &got[2] {
            Record::Bind { binding, .. } => assert_eq!(binding.key.to_string(), "text ключ"),
            r => panic!("{r:?}"),
        }
        assert_eq!(got[3], Record::Unbind { rank: 3, page: 7 });
    }

    #[test]
    fn reserve_and_hold_records_and_pending_chunks_round_trip() {
        let mut buf = Vec::new();
        put_reserve(&mut buf, 3, 7, 0xDEAD_BEEF);
        put_hold(&mut buf, 3, 8);
        put_unbind(&mut buf, 3, 7);
        let mut got = Vec::new();
        decode_log(&buf, |r| got.push(r)).unwrap();
        assert_eq!(
            got,
            [
                Record::Pending { rank: 3, page: 7, pending: Pending::Reserved(0xDEAD_BEEF) },
                Record::Pending { rank: 3, page: 8, pending: Pending::Held },
                Record::Unbind { rank: 3, page: 7 },
            ]
        );
        for cut in 1..13 {
            assert!(decode_log(&buf[..cut], |_| {}).is_err(), "cut at {cut}");
        }
        let e = [(1u16, Pending::Reserved(5)), (200, Pending::Held)];
        let mut chunk = Vec::new();
        encode_pending(&e, &mut chunk);
        let mut back = Vec::new();
        decode_pending(&chunk, &mut back).unwrap();
        assert_eq!(back, e);
        // A held entry with a tag, or an unknown kind, is corrupt.
        let mut bad = chunk.clone();
        let last = bad.len() - 1;
        bad[last] = 1;
        assert!(decode_pending(&bad, &mut back).is_err());
        bad[2] = 9;
        assert!(decode_pending(&bad, &mut back).is_err());
        assert_eq!(parse_chunk_key(&pending_key(5, 9)), Ok((5, 9)));
    }

    #[test]
    fn truncated_or_garbage_log_is_corrupt_not_a_panic() {
        let mut buf = Vec::new();
        put_bind(&mut buf, 1, 2, 3, KeyRef::parse("some text key"));
        for cut in 0..buf.len() {
            let r = decode_log(&buf[..cut], |_| {});
            assert!(cut == 0 || r.is_err(), "cut at {cut}");
        }
        assert!(decode_log(&[9, 9, 9], |_| {}).is_err());
        let mut bad_utf8 = Vec::new();
        put_bind(&mut bad_utf8, 1, 2, 3, KeyRef::Text("ab"));
        let n = bad_utf8.len();
        bad_utf8[n - 1] = 0xFF;
        assert!(decode_log(&bad_utf8, |_| {}).is_err());
    }

    #[test]
    fn chunk_round_trips_and_checks_order() {
        let e = vec![
            (0u16, Binding { world: 1, key: KeyRef::parse(MD5).to_key() }),
            (255u16, Binding { world: 4, key: Key::Text("x".into()) }),
        ];
        let mut buf = Vec::new();
        encode_chunk(&e, &mut buf);
        let mut back = Vec::new();
        decode_chunk(&buf, &mut back).unwrap();
        assert_eq!(back, e);
        let rev: Vec<_> = e.iter().rev().cloned().collect();
        encode_chunk(&rev, &mut buf);
        assert!(decode_chunk(&buf, &mut back).is_err());
    }

    #[test]
    fn keys_and_names() {
        assert_eq!(parse_chunk_key(&chunk_key(5, 9)), Ok((5, 9)));
        assert!(chunk_key(1, 0) > chunk_key(0, 7), "chunk-major order");
        assert_eq!(parse_rank(&rank_key(4), &77u32.to_le_bytes()), Ok((4, 77)));
        assert_eq!(partition_generation(&log_partition(12)), Some(12));
        assert_eq!(partition_generation(&state_partition(0)), Some(0));
        assert_eq!(partition_generation("meta"), None);
        let k = KeyRef::parse(MD5).to_key();
        let mut b = [0; KEY_BUF];
        assert_eq!(key_str(&k, &mut b), MD5);
        for s in [SHA.to_string(), format!("{SHA}-k"), format!("{SHA}_codec_pool")] {
            let k = KeyRef::parse(&s).to_key();
            assert!(matches!(k, Key::Digest(_)));
            assert_eq!(key_str(&k, &mut b), s);
        }
    }

    #[test]
    fn digest_keys_round_trip_in_the_log() {
        let mut buf = Vec::new();
        let keys = [SHA.to_string(), format!("{SHA}-v"), format!("{SHA}_codec_log_pool")];
        for (i, k) in keys.iter().enumerate() {
            put_bind(&mut buf, 0, i as u32, 1, KeyRef::parse(k));
        }
        let mut got = Vec::new();
        decode_log(&buf, |r| got.push(r)).unwrap();
        for (r, k) in got.iter().zip(&keys) {
            match r {
                Record::Bind { binding, .. } => {
                    assert!(matches!(binding.key, Key::Digest(_)));
                    assert_eq!(binding.key.to_string(), *k);
                }
                r => panic!("{r:?}"),
            }
        }
        let mut one = Vec::new();
        put_bind(&mut one, 0, 0, 1, KeyRef::parse(&keys[2]));
        for cut in 1..one.len() {
            assert!(decode_log(&one[..cut], |_| {}).is_err(), "cut at {cut}");
        }
    }
}
