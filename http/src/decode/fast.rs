//! The fast path: a scanner for the exact body shapes the real clients send,
//! straight from the bytes, with simd-json's tape (`tape.rs`) behind it for
//! everything else.
//!
//! # What it accepts
//!
//! One JSON object whose members are all named in the route's [`Spec`], each
//! at most once, with JSON whitespace (space, tab, CR, LF) anywhere between
//! tokens, nothing but whitespace after it, and these values:
//!
//! - integers `-?[0-9]+` of at most 18 digits, without leading zeros and
//!   other than `-0`, so every one fits in `i64` (no overflow check needed);
//! - *plain strings*: ASCII bytes 0x20–0x7F (DEL included) but `"` and `\`, so a
//!   string's text is exactly its bytes (no escape to undo, no UTF-8 to
//!   check);
//! - keys: plain strings of 1 to `max_key_len` bytes, at most `max_keys` of
//!   them (with the pages to release, for confirm);
//! - allocate/reserve items: a key, or `[key, plain string or null]`;
//! - confirmation items: `[key, integer]`;
//! - a namespace: a plain string of at most `MAX_NAMESPACE_LEN` bytes.
//!
//! vLLM's connector sends these bodies (Python's `json.dumps` spacing), so do
//! SGLang's client (orjson, compact) and perf's load generator.
//!
//! # Why it is safe
//!
//! The scanner never produces an error: on any byte it does not expect it
//! answers `None` and the caller decodes the body with simd-json as before.
//! So every 400 still comes from the tape walk, with its text and precedence.
//! What it accepts is a subset of JSON on which the tape walk's answer is
//! certain: no field repeated (the tape walk takes the last), no unknown
//! field (skipped there), no escape, no number that simd-json could read as
//! a float or refuse, no limit reached (those are errors there). On that
//! subset both paths give the same typed arguments; the `fast` fuzz target
//! and the proptests in `tests.rs` check it with the tape walk as the oracle.
//!
//! # Two passes, no `unsafe`
//!
//! The scan borrows the body only briefly and records where each key lies
//! (in a [`Scratch`] reused across requests), because a result borrowed
//! from the body for the request's lifetime would keep the body from going
//! to simd-json when the scan gives up. Once the scan has accepted the whole
//! body, [`Scratch::finish`] borrows it for good and cuts the keys out of it,
//! checking as UTF-8 what it hands out as text (it is ASCII, so this cannot
//! fail): the whole body once for the lists of `&str`, only the text keys
//! and the namespace for a lookup list.
//!
//! # Lookup keys
//!
//! The lists of keys to look up (exists, locations) come out as classified
//! keys ([`KeyRef`]), not `&str`: a key that is 32 hex digits and its
//! closing quote (or 64, bare or with `-k`/`-v`) is checked and decoded by
//! [`KeyRef::compact`] straight from the bytes, which also proves it plain;
//! any other key is scanned as a plain string and classified by
//! [`KeyRef::parse`] once the whole body is accepted (a `_<pool>` suffix
//! interns its pool name, which a body refused later must not do). The
//! tape walk classifies its keys with the same `KeyRef::parse`.

use super::{DecodeError, Limits, MAX_NAMESPACE_LEN};
use crate::core::key::Digest;
use crate::core::KeyRef;

mod items;
pub(super) use items::int_at;
use items::{
    compact_end, digest_confirmation, digest_key, digest_pair, fixed_list, hex_confirmation, hex_key, hex_pair, is_ws,
};

/// Where a string's text lies in the body: byte offsets, quotes excluded.
type Span = (usize, usize);

/// The kinds of value a fast-path field holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Value {
    /// An integer (`rank`).
    Int,
    /// A list of keys (SGLang's delete).
    Keys,
    /// A list of keys to look up (exists, locations), classified while
    /// scanned.
    Lookup,
    /// A list of vLLM keys to look up, every one 32 lowercase hex digits
    /// (not all zero), decoded into [`Scratch::hex`] as scanned; any other
    /// key gives the scan up (the route then scans for [`Value::Lookup`]).
    Hex,
    /// A list of SGLang keys to look up, every one 64 lowercase hex digits
    /// bare or with `-k`/`-v` ([`Digest`]), decoded into
    /// [`Scratch::digests`] as scanned; any other key (a `_<pool>` suffix
    /// among them, which would intern its pool) gives the scan up.
    Digests,
    /// A list of keys or `[key, prefix_key]` pairs (allocate, reserve).
    KeyPairs,
    /// [`Value::KeyPairs`] of vLLM keys only, every one 32 lowercase hex
    /// digits (not all zero), decoded into [`Scratch::hex`] as
    /// [`Value::Hex`] is; any other key gives the scan up.
    HexPairs,
    /// [`Value::KeyPairs`] of SGLang keys only, every one a digest as
    /// [`Value::Digests`] takes it, decoded into [`Scratch::digests`]; any
    /// other key gives the scan up.
    DigestPairs,
    /// A list of `[key, page]` pairs (confirm).
    Confirmations,
    /// [`Value::Confirmations`] of SGLang keys only, every one a digest as
    /// [`Value::Digests`] takes it, decoded into [`Scratch::digest_pairs`];
    /// any other key gives the scan up.
    DigestConfirmations,
    /// A list of pages (`pages_to_release`).
    Releases,
    /// SGLang's `namespace`.
    Namespace,
}

/// The members a route's body may have on the fast path, and which of them
/// it must have.
#[derive(Debug)]
pub(super) struct Spec {
    /// Each member's name and kind of value (at most 8).
    fields: &'static [(&'static [u8], Value)],
    /// Bit `i` set: `fields[i]` must be present.
    required: u8,
}

/// `batch_exists`: `{"keys": [...]}`.
pub(super) const EXISTS: Spec = Spec { fields: &[(b"keys", Value::Lookup)], required: 0 };
/// `get_locations`: `{"rank": R, "keys": [...]}`.
pub(super) const LOCATIONS: Spec = Spec { fields: &[(b"rank", Value::Int), (b"keys", Value::Lookup)], required: 0b11 };
/// `batch_exists` of 32-hex keys only ([`Value::Hex`]).
pub(super) const EXISTS_HEX: Spec = Spec { fields: &[(b"keys", Value::Hex)], required: 0 };
/// `get_locations` of 32-hex keys only ([`Value::Hex`]).
pub(super) const LOCATIONS_HEX: Spec = Spec { fields: &[(b"rank", Value::Int), (b"keys", Value::Hex)], required: 0b11 };
/// SGLang's `exists`, `get_page_indices` of digest keys only
/// ([`Value::Digests`]).
pub(super) const SPACE_LOOKUP_DIGESTS: Spec =
    Spec { fields: &[(b"keys", Value::Digests), (b"namespace", Value::Namespace)], required: 0b1 };
/// `batch_allocate`: `{"rank": R, "keys": [[key, prefix], ...]}`.
pub(super) const ALLOCATE: Spec = Spec { fields: &[(b"rank", Value::Int), (b"keys", Value::KeyPairs)], required: 0b11 };
/// `batch_allocate` of 32-hex keys only ([`Value::HexPairs`]).
pub(super) const ALLOCATE_HEX: Spec =
    Spec { fields: &[(b"rank", Value::Int), (b"keys", Value::HexPairs)], required: 0b11 };
/// `confirm_write`: `{"rank": R, "confirmations": [...], "pages_to_release": [...]}`.
pub(super) const CONFIRM: Spec = Spec {
    fields: &[(b"rank", Value::Int), (b"confirmations", Value::Confirmations), (b"pages_to_release", Value::Releases)],
    required: 0b1,
};
/// `longest_prefix` as a router sends a chain of keys: `{"keys": [...]}`
/// alone (token ids, a dialect or any other field go to simd-json).
pub(super) const PREFIX_KEYS: Spec = Spec { fields: &[(b"keys", Value::Lookup)], required: 0b1 };
/// [`PREFIX_KEYS`] of 32-hex keys only ([`Value::Hex`]).
pub(super) const PREFIX_KEYS_HEX: Spec = Spec { fields: &[(b"keys", Value::Hex)], required: 0b1 };
/// SGLang's `delete_keys`.
pub(super) const SPACE_KEYS: Spec =
    Spec { fields: &[(b"keys", Value::Keys), (b"namespace", Value::Namespace)], required: 0b1 };
/// SGLang's `exists`, `get_page_indices`.
pub(super) const SPACE_LOOKUP: Spec =
    Spec { fields: &[(b"keys", Value::Lookup), (b"namespace", Value::Namespace)], required: 0b1 };
/// SGLang's `reserve_and_allocate_page_indices`.
pub(super) const SPACE_RESERVE: Spec =
    Spec { fields: &[(b"keys", Value::KeyPairs), (b"namespace", Value::Namespace)], required: 0b1 };
/// SGLang's `reserve_and_allocate_page_indices` of digest keys only
/// ([`Value::DigestPairs`]).
pub(super) const SPACE_RESERVE_DIGESTS: Spec =
    Spec { fields: &[(b"keys", Value::DigestPairs), (b"namespace", Value::Namespace)], required: 0b1 };
/// SGLang's `confirm_write` of digest keys only
/// ([`Value::DigestConfirmations`]).
pub(super) const SPACE_CONFIRM_DIGESTS: Spec = Spec {
    fields: &[
        (b"written_keys_to_confirm", Value::DigestConfirmations),
        (b"pages_to_release", Value::Releases),
        (b"namespace", Value::Namespace),
    ],
    required: 0,
};
/// SGLang's `confirm_write`.
pub(super) const SPACE_CONFIRM: Spec = Spec {
    fields: &[
        (b"written_keys_to_confirm", Value::Confirmations),
        (b"pages_to_release", Value::Releases),
        (b"namespace", Value::Namespace),
    ],
    required: 0,
};

/// Keys up to this many leave their scratch in place for the next request.
const RETAIN_KEYS: usize = 4096;

/// What a successful scan found besides the lists kept in the [`Scratch`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Scan {
    /// The integer field, if the spec has one.
    pub(super) rank: Option<i64>,
    /// The namespace, if present.
    namespace: Option<Span>,
}

impl Scan {
    /// The namespace in `body` (the body scanned), or `default` when it
    /// named none.
    pub(super) fn namespace_in<'a>(&self, body: &'a [u8], default: &'a str) -> Option<&'a str> {
        match self.namespace {
            None => Some(default),
            Some((start, end)) => std::str::from_utf8(body.get(start..end)?).ok(),
        }
    }
}

/// The lists of the last scan, reused across requests.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// Every key, in request order.
    keys: Vec<Span>,
    /// Every key of a lookup list, in request order: the compact ones
    /// decoded by the scan (a 32-hex key, or a 64-hex digest bare or with
    /// `-k`/`-v`: never one that would intern a pool name, which waits
    /// until the whole body is accepted), the others an empty text for now.
    /// [`Built::lookups`] hands the vector itself to the request.
    lookups: Vec<KeyRef<'static>>,
    /// The place in `lookups` (or `pairs`) and the span of each key left
    /// as text, for [`Built::lookups`] (or [`Built::confirmations`]) to
    /// classify ([`KeyRef::parse`]).
    texts: Vec<(usize, Span)>,
    /// The span of each key of `lookups`, for an allocate's answer.
    spans: Vec<Span>,
    /// The `(key, page)` confirmations, their keys classified as a lookup
    /// list's are; handed over whole by [`Built::confirmations`].
    pairs: Vec<(KeyRef<'static>, i64)>,
    /// The pages to release, in request order.
    releases: Vec<i64>,
    /// The `(digest, page)` confirmations of a list whose every key is 32
    /// hex digits, kept warm as `hex` is; [`Built::confirmations`] makes
    /// the request's pairs from them.
    hex_pairs: Vec<(u128, i64)>,
    /// The digests of a [`Value::Hex`] list, in request order; kept warm
    /// across requests (lent, never handed over: [`Scratch::hex`]).
    hex: Vec<u128>,
    /// The digests of a [`Value::Digests`] or [`Value::DigestPairs`]
    /// list, in request order, kept warm as `hex` is.
    digests: Vec<Digest>,
    /// The `(digest, page)` confirmations of a
    /// [`Value::DigestConfirmations`] list, in request order, kept warm as
    /// `hex` is (lent: [`Scratch::digest_pairs`]).
    digest_pairs: Vec<(Digest, i64)>,
}

impl Scratch {
    /// Scans `body` as one of the shapes of `spec`. `None` means "not
    /// recognised with certainty", never "invalid": the caller then decodes
    /// the body with simd-json.
    pub(super) fn scan(&mut self, body: &[u8], spec: &Spec, limits: Limits) -> Option<Scan> {
        if self.keys.capacity() > RETAIN_KEYS
            || self.releases.capacity() > RETAIN_KEYS
            || self.lookups.capacity() > RETAIN_KEYS
            || self.pairs.capacity() > RETAIN_KEYS
            || self.spans.capacity() > RETAIN_KEYS
            || self.hex.capacity() > RETAIN_KEYS
            || self.hex_pairs.capacity() > RETAIN_KEYS
            || self.digests.capacity() > RETAIN_KEYS
            || self.digest_pairs.capacity() > RETAIN_KEYS
        {
            *self = Self::default();
        }
        self.keys.clear();
        self.lookups.clear();
        self.texts.clear();
        self.spans.clear();
        self.pairs.clear();
        self.releases.clear();
        self.hex.clear();
        self.hex_pairs.clear();
        self.digests.clear();
        self.digest_pairs.clear();
        let mut c = Cursor { b: body, at: 0 };
        let mut scan = Scan { rank: None, namespace: None };
        let mut seen = 0u8;
        if c.next()? != b'{' {
            return None;
        }
        if c.peek()? == b'}' {
            c.at += 1;
        } else {
            loop {
                let (start, end) = c.string()?;
                let name = body.get(start..end)?;
                let i = spec.fields.iter().position(|(n, _)| *n == name)?;
                let bit = 1u8.checked_shl(u32::try_from(i).ok()?)?;
                if seen & bit != 0 {
                    return None;
                }
                seen |= bit;
                if c.next()? != b':' {
                    return None;
                }
                self.value(&mut c, spec.fields.get(i)?.1, &mut scan, limits)?;
                match c.next()? {
                    b',' => {}
                    b'}' => break,
                    _ => return None,
                }
            }
        }
        c.ws();
        (c.at == body.len() && seen & spec.required == spec.required).then_some(scan)
    }

    /// Scans one member's value into `scan` or the lists.
    fn value(&mut self, c: &mut Cursor<'_>, kind: Value, scan: &mut Scan, limits: Limits) -> Option<()> {
        match kind {
            Value::Int => scan.rank = Some(c.int()?),
            Value::Namespace => {
                let (start, end) = c.string()?;
                if end - start > MAX_NAMESPACE_LEN {
                    return None;
                }
                scan.namespace = Some((start, end));
            }
            Value::Keys => c.list(|c| self.key(c, limits))?,
            Value::Lookup => {
                // Room for as many keys as the rest of the body could hold
                // as 32-hex keys: the list is the request's, handed over
                // whole (`Built::lookups`), so it is not kept warm.
                let likely = (c.b.len() - c.at) / 34 + 1;
                self.lookups.reserve(likely.min(limits.max_keys));
                c.list(|c| self.lookup::<false>(c, limits))?;
            }
            Value::Hex => {
                // The scratch's vector, kept warm, taken out for the loop so
                // that its length stays in a register.
                let mut hex = std::mem::take(&mut self.hex);
                let listed = fixed_list(c, &mut hex, limits, hex_key);
                self.hex = hex;
                listed?
            }
            Value::HexPairs => {
                // As `Value::Hex`.
                let mut hex = std::mem::take(&mut self.hex);
                let listed = fixed_list(c, &mut hex, limits, hex_pair);
                self.hex = hex;
                listed?
            }
            Value::Digests => {
                // As `Value::Hex`.
                let mut digests = std::mem::take(&mut self.digests);
                let listed = fixed_list(c, &mut digests, limits, digest_key);
                self.digests = digests;
                listed?
            }
            Value::DigestPairs => {
                // As `Value::Hex`.
                let mut digests = std::mem::take(&mut self.digests);
                let listed = fixed_list(c, &mut digests, limits, digest_pair);
                self.digests = digests;
                listed?
            }
            Value::DigestConfirmations => {
                // As `Value::Hex`; the releases scanned before count
                // against the limit, as in `Value::Confirmations`.
                let room = Limits { max_keys: limits.max_keys.saturating_sub(self.items()), ..limits };
                let mut pairs = std::mem::take(&mut self.digest_pairs);
                let listed = fixed_list(c, &mut pairs, room, digest_confirmation);
                self.digest_pairs = pairs;
                listed?
            }
            Value::KeyPairs => {
                // As a lookup list's (`Value::Lookup`).
                let likely = (c.b.len() - c.at) / 34 + 1;
                self.lookups.reserve(likely.min(limits.max_keys));
                self.spans.reserve(likely.min(limits.max_keys));
                c.list(|c| {
                    if c.peek()? != b'[' {
                        return self.lookup::<true>(c, limits);
                    }
                    c.at += 1;
                    self.lookup::<true>(c, limits)?;
                    if c.next()? != b',' {
                        return None;
                    }
                    // The prefix key is read past; only its form is checked.
                    if c.peek()? == b'"' {
                        c.string()?;
                    } else {
                        c.literal(b"null")?;
                    }
                    (c.next()? == b']').then_some(())
                })?
            }
            Value::Confirmations => {
                // vLLM's connector's body first, in one loop of its own
                // (`fixed_list`): every key 32 hex digits, each item
                // `[key, page]`, decoded into `hex_pairs` (16-byte keys: as
                // `KeyRef`s of 48 the loop's pushes went through `memcpy`).
                // Any other list is scanned again from its start, item by
                // item; both give the same pairs (`KeyRef::compact` of 32
                // bytes is `KeyRef::hex_of`).
                let room = Limits { max_keys: limits.max_keys.saturating_sub(self.items()), ..limits };
                let start = c.at;
                let mut hex_pairs = std::mem::take(&mut self.hex_pairs);
                let listed = fixed_list(c, &mut hex_pairs, room, hex_confirmation);
                self.hex_pairs = hex_pairs;
                if listed.is_none() {
                    self.hex_pairs.clear();
                    c.at = start;
                    // Room for as many pairs as the rest of the body could
                    // hold with 32-hex keys (`["…",N],`): handed over whole,
                    // as a lookup list is.
                    let likely = (c.b.len() - c.at) / 40 + 1;
                    self.pairs.reserve(likely.min(limits.max_keys));
                    c.list(|c| self.pair(c, limits))?
                }
            }
            Value::Releases => c.list(|c| {
                let page = c.int()?;
                self.room(limits)?;
                self.releases.push(page);
                Some(())
            })?,
        }
        Some(())
    }

    /// `Some` while one more item fits in `max_keys` (confirmations and
    /// releases count together, as confirm's limit does; no body has two
    /// of the other lists).
    fn room(&self, limits: Limits) -> Option<()> {
        (self.items() < limits.max_keys).then_some(())
    }

    /// The items scanned so far, of every list ([`Self::room`]).
    fn items(&self) -> usize {
        self.keys.len()
            + self.lookups.len()
            + self.pairs.len()
            + self.hex_pairs.len()
            + self.digest_pairs.len()
            + self.releases.len()
    }

    /// Scans one key: a plain string within the limits.
    fn key(&mut self, c: &mut Cursor<'_>, limits: Limits) -> Option<()> {
        let (start, end) = c.string()?;
        let len = end - start;
        if len == 0 || len > limits.max_key_len {
            return None;
        }
        self.room(limits)?;
        self.keys.push((start, end));
        Some(())
    }

    /// Scans one key of a lookup list, as [`Self::key`] does, classifying
    /// it as it goes: a 32-hex key is its 32 digits and the closing quote,
    /// checked and decoded in one step (hex digits are plain bytes, so the
    /// string scan has nothing to add), an SGLang digest likewise in two;
    /// any other key is scanned as a plain string and pushed as a
    /// placeholder and its span, to classify once the whole body is
    /// accepted. With `SPANS`, an allocate's or a reserve's key: its span is
    /// also kept in `spans` (vLLM's answer repeats the key's text). Pushed
    /// where found: a shared classifier answering a key, its span and its
    /// kind cost a lookup list 17 instructions a key and an allocate's
    /// about 70.
    #[inline]
    fn lookup<const SPANS: bool>(&mut self, c: &mut Cursor<'_>, limits: Limits) -> Option<()> {
        self.room(limits)?;
        if c.next()? != b'"' {
            return None;
        }
        let (b, start) = (c.b, c.at);
        if let Some(end) = compact_end(b, start, limits) {
            if let Some(k) = b.get(start..end).and_then(KeyRef::compact) {
                self.lookups.push(k);
                if SPANS {
                    self.spans.push((start, end));
                }
                c.at = end + 1;
                return Some(());
            }
        }
        let (start, end) = c.rest_of_string()?;
        if start == end || end - start > limits.max_key_len {
            return None;
        }
        self.texts.push((self.lookups.len(), (start, end)));
        self.lookups.push(KeyRef::Text(""));
        if SPANS {
            self.spans.push((start, end));
        }
        Some(())
    }

    /// The digests a [`Value::Hex`] list's scan decoded, in request order.
    pub(super) fn hex(&self) -> &[u128] {
        &self.hex
    }

    /// The digests a [`Value::Digests`] list's scan decoded, in request
    /// order.
    pub(super) fn digests(&self) -> &[Digest] {
        &self.digests
    }

    /// The `(digest, page)` confirmations a [`Value::DigestConfirmations`]
    /// list's scan decoded, in request order.
    pub(super) fn digest_pairs(&self) -> &[(Digest, i64)] {
        &self.digest_pairs
    }

    /// The pages to release the scan found, in request order.
    pub(super) fn released(&self) -> &[i64] {
        &self.releases
    }

    /// Scans one `[key, page]` confirmation, its key classified as a
    /// lookup list's is ([`Self::lookup`]), into `pairs`.
    #[inline]
    fn pair(&mut self, c: &mut Cursor<'_>, limits: Limits) -> Option<()> {
        if c.next()? != b'[' {
            return None;
        }
        self.room(limits)?;
        if c.next()? != b'"' {
            return None;
        }
        let (b, start) = (c.b, c.at);
        let compact = compact_end(b, start, limits).and_then(|end| Some((end, KeyRef::compact(b.get(start..end)?)?)));
        let key = match compact {
            Some((end, k)) => {
                c.at = end + 1;
                k
            }
            None => {
                let (start, end) = c.rest_of_string()?;
                if start == end || end - start > limits.max_key_len {
                    return None;
                }
                self.texts.push((self.pairs.len(), (start, end)));
                KeyRef::Text("")
            }
        };
        if c.next()? != b',' {
            return None;
        }
        let page = c.int()?;
        self.pairs.push((key, page));
        (c.next()? == b']').then_some(())
    }

    /// Borrows the scanned body for good and builds the typed arguments.
    ///
    /// # Errors
    ///
    /// None in practice: the scan admits ASCII only, so the body is UTF-8
    /// and every span falls on character boundaries. Were it otherwise the
    /// answer would be the tape walk's for a body that is not UTF-8.
    pub(super) fn finish<'a, T>(
        &mut self,
        body: &'a [u8],
        build: impl FnOnce(&mut Built<'_, 'a>) -> Option<T>,
    ) -> Result<T, DecodeError> {
        build(&mut Built { scratch: self, body }).ok_or(DecodeError::InvalidJson { reason: "invalid UTF-8" })
    }
}

/// A scan's results over the body, for [`Scratch::finish`]. Text is
/// checked as UTF-8 where it is cut out: the whole body once for the key
/// lists of `&str`, a span for a lookup key kept as text or a namespace.
pub(super) struct Built<'s, 'a> {
    /// The lists the scan filled.
    scratch: &'s mut Scratch,
    /// The whole body.
    body: &'a [u8],
}

impl<'a> Built<'_, 'a> {
    /// The whole body as text.
    fn text(&self) -> Option<&'a str> {
        std::str::from_utf8(self.body).ok()
    }

    /// The text of one span.
    fn span(&self, (start, end): Span) -> Option<&'a str> {
        std::str::from_utf8(self.body.get(start..end)?).ok()
    }

    /// The keys, in request order.
    pub(super) fn keys(&self) -> Option<Vec<&'a str>> {
        self.texts_of(&self.scratch.keys)
    }

    /// The text of an allocate's keys, in request order.
    pub(super) fn allocated(&self) -> Option<Vec<&'a str>> {
        self.texts_of(&self.scratch.spans)
    }

    /// The text of each of `spans`.
    fn texts_of(&self, spans: &[Span]) -> Option<Vec<&'a str>> {
        let text = self.text()?;
        let mut out = Vec::with_capacity(spans.len());
        for &(start, end) in spans {
            out.push(text.get(start..end)?);
        }
        Some(out)
    }

    /// The keys of a lookup list, classified, in request order: the
    /// scratch's vector itself, its text keys filled in.
    pub(super) fn lookups(&mut self) -> Option<Vec<KeyRef<'a>>> {
        let mut out: Vec<KeyRef<'a>> = std::mem::take(&mut self.scratch.lookups);
        for &(i, span) in &self.scratch.texts {
            *out.get_mut(i)? = KeyRef::parse(self.span(span)?);
        }
        Some(out)
    }

    /// The `(key, page)` confirmations, in request order, their keys
    /// classified: the scratch's vector itself, its text keys filled in.
    pub(super) fn confirmations(&mut self) -> Option<Vec<(KeyRef<'a>, i64)>> {
        if !self.scratch.hex_pairs.is_empty() {
            return Some(self.scratch.hex_pairs.iter().map(|&(v, page)| (KeyRef::Hex(v), page)).collect());
        }
        let mut out: Vec<(KeyRef<'a>, i64)> = std::mem::take(&mut self.scratch.pairs);
        for &(i, span) in &self.scratch.texts {
            out.get_mut(i)?.0 = KeyRef::parse(self.span(span)?);
        }
        Some(out)
    }

    /// The pages to release, in request order.
    pub(super) fn releases(&self) -> Vec<i64> {
        self.scratch.releases.clone()
    }

    /// The namespace of `scan`, or `default` when the body named none.
    pub(super) fn namespace(&self, scan: &Scan, default: &'a str) -> Option<&'a str> {
        scan.namespace_in(self.body, default)
    }
}

/// A position in the body being scanned.
struct Cursor<'b> {
    /// The body.
    b: &'b [u8],
    /// The next byte to read.
    at: usize,
}

impl Cursor<'_> {
    /// Skips JSON whitespace.
    #[inline(always)]
    fn ws(&mut self) {
        // Any byte above the space ends it at once: one comparison for the
        // token that usually follows.
        while self.b.get(self.at).is_some_and(|&c| is_ws(c)) {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.at).copied()
    }

    /// The next byte after whitespace, consumed.
    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.at += 1;
        Some(c)
    }

    /// Consumes `word` (after whitespace).
    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.ws();
        let end = self.at.checked_add(word.len())?;
        (self.b.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// A plain string (after whitespace): the span of its text.
    #[inline]
    fn string(&mut self) -> Option<Span> {
        if self.next()? != b'"' {
            return None;
        }
        self.rest_of_string()
    }

    /// The rest of a plain string whose opening quote was just read.
    #[inline]
    fn rest_of_string(&mut self) -> Option<Span> {
        let start = self.at;
        if self.b.get(start) == Some(&b'"') {
            // The empty prefix key of vLLM's allocate pairs.
            self.at = start + 1;
            return Some((start, start));
        }
        // 32 bytes at a time on x86-64 (plain.rs): a vLLM key in one step.
        let i = start + super::plain::run(self.b.get(start..)?);
        if self.b.get(i) != Some(&b'"') {
            return None;
        }
        self.at = i + 1;
        Some((start, i))
    }

    /// An integer of at most 18 digits (after whitespace). What follows is
    /// left to the caller, which accepts only `,` `]` `}` or whitespace, so
    /// `1.5` and `1e3` are refused there.
    fn int(&mut self) -> Option<i64> {
        self.ws();
        let (value, end) = int_at(self.b, self.at)?;
        self.at = end;
        Some(value)
    }

    /// A list (after whitespace), each item scanned by `item`.
    fn list(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if self.next()? != b'[' {
            return None;
        }
        if self.peek()? == b']' {
            self.at += 1;
            return Some(());
        }
        loop {
            item(self)?;
            match self.next()? {
                b',' => {}
                b']' => return Some(()),
                _ => return None,
            }
        }
    }
}
