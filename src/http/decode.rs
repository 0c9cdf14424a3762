//! Request decoding: turns a request body into the typed arguments of one
//! endpoint, or into the exact `detail` text of the 400 answer.
//!
//! # Why this exists
//!
//! Every request of this API is a small JSON object on the hot path of vLLM's
//! KV-cache saves and loads (a 128-key allocate is about 5.7 KB). Building a
//! generic value tree per request would allocate once per key and once per
//! object; instead, the body is parsed once by simd-json into its flat *tape*
//! (one node per JSON value, containers carrying the size of their subtree),
//! and the tape is walked directly. Strings are unescaped by simd-json in
//! place inside the body, so every key comes out as a `&str` borrowed from
//! the request buffer: no allocation per key, one `Vec` per list, pre-sized
//! from the array header (after the list's length has been checked against
//! [`Limits`]).
//!
//! # Scratch reuse
//!
//! A [`Decoder`] owns simd-json's [`Buffers`] and the tape's `Vec` and reuses
//! both across requests: [`Tape::reset`] hands the empty allocation back with
//! a fresh lifetime, so nothing is allocated per request once the scratch is
//! warm except the result lists. After a body larger than
//! [`RETAIN_LIMIT`] the scratch is dropped rather than kept, so one huge
//! request does not pin megabytes for the life of a connection. One decoder
//! per connection (or per worker thread) is the intended use.
//!
//! Measured once, indicatively (release build, 2-core development VM, the
//! 128-key allocate body in compact form, 5.1 KB): a reused decoder takes
//! about 6.2 µs and one allocation per call (the key list); a fresh decoder
//! per call about 6.4 µs and 9 allocations. simd-json's parse alone is about
//! 5.9 µs onto a reused tape against 7.0 µs onto a new one, so the walk
//! itself costs a few hundred nanoseconds and reuse is worth keeping.
//!
//! # Rules
//!
//! The detail texts and their precedence follow `docs/api.md` and the
//! Python reference: unknown fields are ignored, a repeated field takes its
//! last value (like Python's `json`), and the reference's "Invalid request
//! format" check comes before any type check of the fields it names. Checks
//! of values against server state (page ranges, `num_pages > 0`) belong to
//! the core, not to this module.
//!
//! Known limit: simd-json rejects an integer literal that does not fit in
//! 64 bits (above `u64::MAX` or below `i64::MIN`) while parsing, before the
//! field is known, so such a body gets `Invalid JSON body: invalid number
//! ...` rather than `Invalid field '<name>': integer out of range` (which is
//! what a `u64` above `i64::MAX` gets).

#![forbid(unsafe_code)]

use std::fmt;

use simd_json::{Buffers, ErrorType, Node, StaticNode, Tape};

/// Bodies up to this many bytes leave their parse scratch in the [`Decoder`]
/// for the next request; after a larger one the scratch is released.
pub const RETAIN_LIMIT: usize = 256 * 1024;

/// Initial capacity of the parse scratch, enough for a 128-key allocate.
const INITIAL_CAPACITY: usize = 8 * 1024;

/// Per-request bounds on the lists a body may carry, checked while decoding
/// so that an oversized request is refused before any work is done for it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most items one list may hold (for confirm: confirmations and pages to
    /// release together).
    pub max_keys: usize,
    /// Most bytes one key may have, after JSON unescaping.
    pub max_key_len: usize,
}

/// The role named in an initialize request.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// A tensor-parallel worker that owns pages on its rank.
    Worker,
    /// The scheduler, which needs no state.
    Scheduler,
}

/// Body of `POST /rank/{rank}/initialize`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct InitializeBody {
    /// Pages on this rank; 0 when absent. Not range-checked here.
    pub num_pages: i64,
    /// The caller's role; [`Role::Worker`] when absent.
    pub role: Role,
}

/// Body of `POST /keys/batch_allocate`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocateBody<'a> {
    /// The rank to allocate on.
    pub rank: i64,
    /// The keys, in request order, duplicates kept (the core collapses them).
    /// The `prefix_key` of each `[key, prefix_key]` pair is dropped.
    pub keys: Vec<&'a str>,
}

/// Body of `POST /keys/confirm_write`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfirmBody<'a> {
    /// The rank the pages belong to.
    pub rank: i64,
    /// `(key, page)` pairs to bind, in request order. Pages may be negative;
    /// the core answers those as out of range.
    pub confirmations: Vec<(&'a str, i64)>,
    /// Pages to free, in request order.
    pub releases: Vec<i64>,
}

/// Body of `POST /keys/batch_exists`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistsBody<'a> {
    /// The keys to look up, in request order.
    pub keys: Vec<&'a str>,
}

/// Body of `POST /keys/get_locations`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocationsBody<'a> {
    /// The rank whose pages are asked for.
    pub rank: i64,
    /// The keys to locate, in request order.
    pub keys: Vec<&'a str>,
}

/// A short, fixed reason why simd-json refused a body, in our own words, so
/// that the client sees neither Rust `Debug` output nor parser internals.
///
/// No byte offset is given: simd-json reports offsets for some errors only
/// (many string and structure errors say 0), and a wrong one misleads more
/// than none.
fn syntax_reason(e: &simd_json::Error) -> &'static str {
    match e.error() {
        ErrorType::Eof => "unexpected end of input",
        ErrorType::InvalidNumber | ErrorType::InvalidExponent | ErrorType::Overflow => {
            "invalid number (or integer beyond 64 bits)"
        }
        ErrorType::InvalidEscape | ErrorType::InvalidUnicodeEscape | ErrorType::InvalidUnicodeCodepoint => {
            "invalid escape in string"
        }
        ErrorType::InvalidUtf8 => "invalid UTF-8",
        ErrorType::UnterminatedString => "unterminated string",
        ErrorType::ExpectedTrue | ErrorType::ExpectedFalse | ErrorType::ExpectedNull => "invalid literal",
        ErrorType::DepthLimitExceeded => "nesting too deep",
        ErrorType::InputTooLarge => "body too large",
        ErrorType::KeyMustBeAString | ErrorType::ExpectedObjectKey | ErrorType::BadKeyType => {
            "expected a string object key"
        }
        ErrorType::ExpectedObjectColon => "expected ':' after object key",
        ErrorType::ExpectedObjectContent | ErrorType::ExpectedMapComma | ErrorType::ExpectedMapEnd => {
            "malformed object"
        }
        ErrorType::ExpectedArrayContent | ErrorType::ExpectedArrayComma => "malformed array",
        ErrorType::TrailingData => "trailing characters after the JSON value",
        // simd-json reports unterminated containers and strings, control
        // characters in strings and trailing data as `Syntax` or
        // `InternalError` alike.
        _ => "malformed or truncated JSON",
    }
}

/// A request body this server refuses with 400. The `Display` text of each
/// variant is the exact `detail` of the answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The body is empty or not valid JSON.
    #[error("Invalid JSON body: {reason}")]
    InvalidJson {
        /// A short, fixed description of the problem.
        reason: &'static str,
    },
    /// The body is valid JSON but not an object.
    #[error("Request body must be a JSON object")]
    NotAnObject,
    /// `rank` is missing or null, or the named list field is missing or not a
    /// list (the reference's wording; `list` is `"keys"` or `"confirmations"`).
    #[error("Invalid request format: need 'rank' and '{list}'")]
    InvalidRequestFormat {
        /// The list field the endpoint needs besides `rank`.
        list: &'static str,
    },
    /// A field that must be an integer holds something else.
    #[error("Invalid field '{field}': expected an integer")]
    ExpectedInteger {
        /// The field's name.
        field: &'static str,
    },
    /// An integer field holds a value above `i64::MAX`.
    #[error("Invalid field '{field}': integer out of range")]
    IntegerOutOfRange {
        /// The field's name.
        field: &'static str,
    },
    /// Initialize: `role` is present but not `"worker"` or `"scheduler"`.
    #[error("Invalid initialization parameters")]
    InvalidInitialization,
    /// Exists: `keys` is present but not a list.
    #[error("Invalid keys format")]
    InvalidKeysFormat,
    /// Allocate: an item of `keys` is neither a key string nor a list whose
    /// first element is a key string.
    #[error("Invalid field 'keys': item {index} must be a key string or a [key, prefix_key] pair")]
    KeyItem {
        /// Zero-based position in `keys`.
        index: usize,
    },
    /// Exists / locations: an item of `keys` is not a string.
    #[error("Invalid field 'keys': item {index} must be a string")]
    KeyNotString {
        /// Zero-based position in `keys`.
        index: usize,
    },
    /// A key is the empty string.
    #[error("Invalid field 'keys': item {index} is an empty string")]
    EmptyKey {
        /// Zero-based position in `keys`.
        index: usize,
    },
    /// Confirm: an item of `confirmations` is not a `[key string, integer]`
    /// list of exactly two elements.
    #[error("Invalid field 'confirmations': item {index} must be a [key, page] pair")]
    ConfirmationItem {
        /// Zero-based position in `confirmations`.
        index: usize,
    },
    /// Confirm: a confirmation's key is the empty string.
    #[error("Invalid field 'confirmations': item {index} has an empty key")]
    EmptyConfirmationKey {
        /// Zero-based position in `confirmations`.
        index: usize,
    },
    /// Confirm: `pages_to_release` is present but not a list.
    #[error("Invalid field 'pages_to_release': expected a list of integers")]
    ReleasesNotList,
    /// Confirm: an item of `pages_to_release` is not an integer in `i64`.
    #[error("Invalid field 'pages_to_release': item {index} must be an integer")]
    ReleaseItem {
        /// Zero-based position in `pages_to_release`.
        index: usize,
    },
    /// A key list is longer than [`Limits::max_keys`].
    #[error("Too many keys: {count} > limit {limit}")]
    TooManyKeys {
        /// Items in the list.
        count: usize,
        /// The limit in force.
        limit: usize,
    },
    /// Confirm: confirmations plus pages to release exceed [`Limits::max_keys`].
    #[error("Too many items: {count} > limit {limit}")]
    TooManyItems {
        /// Confirmations plus pages to release.
        count: usize,
        /// The limit in force.
        limit: usize,
    },
    /// A key is longer than [`Limits::max_key_len`] bytes.
    #[error("Key too long: item {index} has {len} bytes > limit {limit}")]
    KeyTooLong {
        /// Zero-based position in its list.
        index: usize,
        /// The key's length in bytes, after unescaping.
        len: usize,
        /// The limit in force.
        limit: usize,
    },
}

/// Reusable parse scratch: simd-json's buffers and the tape allocation.
///
/// Not shared between threads while in use (every method takes `&mut self`);
/// it is `Send`, so it can live in a connection task or a thread-local.
pub struct Decoder {
    /// simd-json's stage-1/stage-2 buffers, reused across bodies.
    buffers: Buffers,
    /// The tape's allocation, empty between calls; its lifetime is re-tied
    /// to each body by [`Tape::reset`].
    tape: Tape<'static>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self { buffers: Buffers::new(INITIAL_CAPACITY), tape: Tape(Vec::new()) }
    }
}

impl fmt::Debug for Decoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder").field("tape_capacity", &self.tape.0.capacity()).finish_non_exhaustive()
    }
}

impl Decoder {
    /// Decodes an initialize body, `{"num_pages": int, "role": "worker" | "scheduler"}`.
    ///
    /// A bad `role` is reported before a bad `num_pages`, as the reference
    /// does.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn initialize(&mut self, body: &mut [u8]) -> Result<InitializeBody, DecodeError> {
        self.parse(body, |tape| {
            let [num_pages, role] = fields(tape, ["num_pages", "role"])?;
            let role = match role.and_then(|v| v.first()) {
                None | Some(Node::String("worker")) => Role::Worker,
                Some(Node::String("scheduler")) => Role::Scheduler,
                Some(_) => return Err(DecodeError::InvalidInitialization),
            };
            let num_pages = match num_pages.and_then(|v| v.first()) {
                None => 0,
                Some(node) => int_field(node, "num_pages")?,
            };
            Ok(InitializeBody { num_pages, role })
        })
    }

    /// Decodes a batch-allocate body, `{"rank": int, "keys": [[key, prefix_key], ...]}`.
    ///
    /// Each item may also be a bare key string; anything after the key in a
    /// pair is skipped unread, whatever its type.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn allocate<'a>(&mut self, body: &'a mut [u8], limits: Limits) -> Result<AllocateBody<'a>, DecodeError> {
        self.parse(body, |tape| {
            let [rank, keys] = fields(tape, ["rank", "keys"])?;
            let (rank, items) = rank_and_list(rank, keys, "keys")?;
            check_count(&items, limits)?;
            let mut out = Vec::with_capacity(items.len());
            for (index, item) in items.enumerate() {
                let key = match item.first() {
                    Some(Node::String(key)) => *key,
                    Some(Node::Array { len, .. }) if *len > 0 => match item.get(1) {
                        Some(Node::String(key)) => *key,
                        _ => return Err(DecodeError::KeyItem { index }),
                    },
                    _ => return Err(DecodeError::KeyItem { index }),
                };
                check_key(key, index, limits, DecodeError::EmptyKey { index })?;
                out.push(key);
            }
            Ok(AllocateBody { rank, keys: out })
        })
    }

    /// Decodes a confirm-write body,
    /// `{"rank": int, "confirmations": [[key, page], ...], "pages_to_release": [page, ...]}`.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn confirm<'a>(&mut self, body: &'a mut [u8], limits: Limits) -> Result<ConfirmBody<'a>, DecodeError> {
        self.parse(body, |tape| {
            let [rank, confirmations, releases] = fields(tape, ["rank", "confirmations", "pages_to_release"])?;
            let confirmations = match confirmations {
                None => Items::EMPTY,
                Some(value) => Items::of(value).ok_or(DecodeError::InvalidRequestFormat { list: "confirmations" })?,
            };
            let rank = match rank.and_then(|v| v.first()) {
                None | Some(Node::Static(StaticNode::Null)) => {
                    return Err(DecodeError::InvalidRequestFormat { list: "confirmations" })
                }
                Some(node) => int_field(node, "rank")?,
            };
            let releases = match releases {
                None => Items::EMPTY,
                Some(value) => Items::of(value).ok_or(DecodeError::ReleasesNotList)?,
            };
            let count = confirmations.len().saturating_add(releases.len());
            if count > limits.max_keys {
                return Err(DecodeError::TooManyItems { count, limit: limits.max_keys });
            }

            let mut pairs = Vec::with_capacity(confirmations.len());
            for (index, item) in confirmations.enumerate() {
                let pair = match item {
                    [Node::Array { len: 2, .. }, Node::String(key), Node::Static(page)] => {
                        int_of(page).ok().map(|page| (*key, page))
                    }
                    _ => None,
                };
                let Some((key, page)) = pair else {
                    return Err(DecodeError::ConfirmationItem { index });
                };
                check_key(key, index, limits, DecodeError::EmptyConfirmationKey { index })?;
                pairs.push((key, page));
            }

            let mut pages = Vec::with_capacity(releases.len());
            for (index, item) in releases.enumerate() {
                match item {
                    [Node::Static(page)] => match int_of(page) {
                        Ok(page) => pages.push(page),
                        Err(_) => return Err(DecodeError::ReleaseItem { index }),
                    },
                    _ => return Err(DecodeError::ReleaseItem { index }),
                }
            }
            Ok(ConfirmBody { rank, confirmations: pairs, releases: pages })
        })
    }

    /// Decodes a batch-exists body, `{"keys": [key, ...]}`; no `keys` means
    /// an empty list.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn exists<'a>(&mut self, body: &'a mut [u8], limits: Limits) -> Result<ExistsBody<'a>, DecodeError> {
        self.parse(body, |tape| {
            let [keys] = fields(tape, ["keys"])?;
            let items = match keys {
                None => Items::EMPTY,
                Some(value) => Items::of(value).ok_or(DecodeError::InvalidKeysFormat)?,
            };
            Ok(ExistsBody { keys: key_strings(items, limits)? })
        })
    }

    /// Decodes a get-locations body, `{"rank": int, "keys": [key, ...]}`.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn locations<'a>(&mut self, body: &'a mut [u8], limits: Limits) -> Result<LocationsBody<'a>, DecodeError> {
        self.parse(body, |tape| {
            let [rank, keys] = fields(tape, ["rank", "keys"])?;
            let (rank, items) = rank_and_list(rank, keys, "keys")?;
            Ok(LocationsBody { rank, keys: key_strings(items, limits)? })
        })
    }

    /// Parses `body` onto the reusable tape and runs `walk` over it.
    ///
    /// The result may borrow strings from `body` (lifetime `'a`) but not
    /// from the tape, which goes back into `self` emptied before returning.
    fn parse<'a, T>(
        &mut self,
        body: &'a mut [u8],
        walk: impl FnOnce(&[Node<'a>]) -> Result<T, DecodeError>,
    ) -> Result<T, DecodeError> {
        if body.iter().all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
            return Err(DecodeError::InvalidJson { reason: "empty body" });
        }
        let large = body.len() > RETAIN_LIMIT;
        let mut tape: Tape<'a> = std::mem::replace(&mut self.tape, Tape(Vec::new())).reset();
        let result = match simd_json::fill_tape(body, &mut self.buffers, &mut tape) {
            Ok(()) => walk(&tape.0),
            Err(e) => Err(DecodeError::InvalidJson { reason: syntax_reason(&e) }),
        };
        if large {
            self.buffers = Buffers::new(INITIAL_CAPACITY);
        } else {
            self.tape = tape.reset();
        }
        result
    }
}

/// Number of tape nodes a value occupies, its own node included.
fn span(node: &Node<'_>) -> usize {
    match node {
        Node::Object { count, .. } | Node::Array { count, .. } => count.saturating_add(1),
        _ => 1,
    }
}

/// The tape slice of the value that starts at `at`, if the tape holds it.
fn value_at<'t, 'a>(tape: &'t [Node<'a>], at: usize) -> Option<&'t [Node<'a>]> {
    let end = at.checked_add(span(tape.get(at)?))?;
    tape.get(at..end)
}

/// Finds the named top-level fields of the root object. Each result is the
/// tape slice of the field's value, taken from its last occurrence; fields not
/// named are skipped without being looked at.
fn fields<'t, 'a, const N: usize>(
    tape: &'t [Node<'a>],
    names: [&str; N],
) -> Result<[Option<&'t [Node<'a>]>; N], DecodeError> {
    let Some(Node::Object { len, .. }) = tape.first() else {
        return Err(DecodeError::NotAnObject);
    };
    let mut found = [None; N];
    let mut at = 1usize;
    for _ in 0..*len {
        let Some(Node::String(name)) = tape.get(at) else {
            break; // Cannot happen on a tape from simd-json.
        };
        let Some(value) = value_at(tape, at.saturating_add(1)) else {
            break;
        };
        if let Some(slot) = names.iter().position(|n| n == name).and_then(|i| found.get_mut(i)) {
            *slot = Some(value);
        }
        at = at.saturating_add(1).saturating_add(value.len());
    }
    Ok(found)
}

/// Reads an integer node as `i64`.
fn int_of(node: &StaticNode) -> Result<i64, IntError> {
    match node {
        StaticNode::I64(v) => Ok(*v),
        StaticNode::U64(v) => i64::try_from(*v).map_err(|_| IntError::OutOfRange),
        _ => Err(IntError::NotInteger),
    }
}

/// Why a node is not an `i64`.
enum IntError {
    /// It is not a JSON integer at all.
    NotInteger,
    /// It is an integer above `i64::MAX`.
    OutOfRange,
}

/// Reads the integer field `field`, with the field-naming error texts.
fn int_field(node: &Node<'_>, field: &'static str) -> Result<i64, DecodeError> {
    match node {
        Node::Static(s) => int_of(s).map_err(|e| match e {
            IntError::NotInteger => DecodeError::ExpectedInteger { field },
            IntError::OutOfRange => DecodeError::IntegerOutOfRange { field },
        }),
        _ => Err(DecodeError::ExpectedInteger { field }),
    }
}

/// The shared top level of allocate and locations (and the reference's
/// check order): `rank` missing or null, or the list missing or not a list,
/// is the "Invalid request format" error; only then is `rank`'s type checked.
fn rank_and_list<'t, 'a>(
    rank: Option<&'t [Node<'a>]>,
    list: Option<&'t [Node<'a>]>,
    name: &'static str,
) -> Result<(i64, Items<'t, 'a>), DecodeError> {
    let format = DecodeError::InvalidRequestFormat { list: name };
    let items = list.and_then(Items::of);
    let (Some(rank), Some(items)) = (rank.and_then(|v| v.first()), items) else {
        return Err(format);
    };
    if matches!(rank, Node::Static(StaticNode::Null)) {
        return Err(format);
    }
    Ok((int_field(rank, "rank")?, items))
}

/// Refuses a key list longer than the limit, before anything is allocated.
fn check_count(items: &Items<'_, '_>, limits: Limits) -> Result<(), DecodeError> {
    if items.len() > limits.max_keys {
        return Err(DecodeError::TooManyKeys { count: items.len(), limit: limits.max_keys });
    }
    Ok(())
}

/// Refuses an empty key (with the list's own error `empty`) or one longer
/// than the limit.
fn check_key(key: &str, index: usize, limits: Limits, empty: DecodeError) -> Result<(), DecodeError> {
    if key.is_empty() {
        return Err(empty);
    }
    if key.len() > limits.max_key_len {
        return Err(DecodeError::KeyTooLong { index, len: key.len(), limit: limits.max_key_len });
    }
    Ok(())
}

/// Collects a list whose items must all be key strings (exists, locations).
fn key_strings<'a>(items: Items<'_, 'a>, limits: Limits) -> Result<Vec<&'a str>, DecodeError> {
    check_count(&items, limits)?;
    let mut keys = Vec::with_capacity(items.len());
    for (index, item) in items.enumerate() {
        let Some(Node::String(key)) = item.first() else {
            return Err(DecodeError::KeyNotString { index });
        };
        check_key(key, index, limits, DecodeError::EmptyKey { index })?;
        keys.push(*key);
    }
    Ok(keys)
}

/// The items of a JSON array on the tape, each yielded as the tape slice of
/// the whole item, so nested values are skipped in one step.
struct Items<'t, 'a> {
    /// Tape nodes from the next item to the end of the tape.
    rest: &'t [Node<'a>],
    /// Items not yet yielded.
    left: usize,
}

impl<'t, 'a> Items<'t, 'a> {
    /// A list with no items (the default of an absent list field).
    const EMPTY: Self = Self { rest: &[], left: 0 };

    /// The items of `value`, or `None` when it is not an array.
    fn of(value: &'t [Node<'a>]) -> Option<Self> {
        match value.split_first() {
            Some((Node::Array { len, .. }, rest)) => Some(Self { rest, left: *len }),
            _ => None,
        }
    }

    /// Items not yet yielded (the array's length before iteration starts).
    fn len(&self) -> usize {
        self.left
    }
}

impl<'t, 'a> Iterator for Items<'t, 'a> {
    type Item = &'t [Node<'a>];

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let (item, rest) = self.rest.split_at_checked(span(self.rest.first()?))?;
        self.rest = rest;
        self.left -= 1;
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use DecodeError as E;

    /// Limits used by most cases: 4 keys of at most 8 bytes.
    const L: Limits = Limits { max_keys: 4, max_key_len: 8 };

    /// Limits large enough for the hot-path bodies.
    const BIG: Limits = Limits { max_keys: 1024, max_key_len: 1024 };

    fn check_init(body: &[u8], want: Result<(i64, Role), &str>) {
        let mut buf = body.to_vec();
        let got = Decoder::default().initialize(&mut buf).map(|b| (b.num_pages, b.role)).map_err(|e| e.to_string());
        assert_eq!(got, want.map_err(str::to_owned), "body {}", String::from_utf8_lossy(body));
    }

    fn check_alloc(body: &[u8], want: Result<(i64, &[&str]), &str>) {
        let mut buf = body.to_vec();
        let got = Decoder::default().allocate(&mut buf, L).map(|b| (b.rank, b.keys)).map_err(|e| e.to_string());
        let want = want.map(|(r, k)| (r, k.to_vec())).map_err(str::to_owned);
        assert_eq!(got, want, "body {}", String::from_utf8_lossy(body));
    }

    #[allow(clippy::type_complexity)]
    fn check_confirm(body: &[u8], want: Result<(i64, &[(&str, i64)], &[i64]), &str>) {
        let mut buf = body.to_vec();
        let got = Decoder::default()
            .confirm(&mut buf, L)
            .map(|b| (b.rank, b.confirmations, b.releases))
            .map_err(|e| e.to_string());
        let want = want.map(|(r, c, p)| (r, c.to_vec(), p.to_vec())).map_err(str::to_owned);
        assert_eq!(got, want, "body {}", String::from_utf8_lossy(body));
    }

    fn check_exists(body: &[u8], want: Result<&[&str], &str>) {
        let mut buf = body.to_vec();
        let got = Decoder::default().exists(&mut buf, L).map(|b| b.keys).map_err(|e| e.to_string());
        assert_eq!(got, want.map(<[&str]>::to_vec).map_err(str::to_owned), "body {}", String::from_utf8_lossy(body));
    }

    fn check_loc(body: &[u8], want: Result<(i64, &[&str]), &str>) {
        let mut buf = body.to_vec();
        let got = Decoder::default().locations(&mut buf, L).map(|b| (b.rank, b.keys)).map_err(|e| e.to_string());
        let want = want.map(|(r, k)| (r, k.to_vec())).map_err(str::to_owned);
        assert_eq!(got, want, "body {}", String::from_utf8_lossy(body));
    }

    /// The error every decoder gives for `body`, as a detail text; all five
    /// must agree (used for the body-level rules).
    fn check_all(body: &[u8], want: &str) {
        let mut d = Decoder::default();
        let texts = [
            d.initialize(&mut body.to_vec()).err().map(|e| e.to_string()),
            d.allocate(&mut body.to_vec(), L).err().map(|e| e.to_string()),
            d.confirm(&mut body.to_vec(), L).err().map(|e| e.to_string()),
            d.exists(&mut body.to_vec(), L).err().map(|e| e.to_string()),
            d.locations(&mut body.to_vec(), L).err().map(|e| e.to_string()),
        ];
        for t in texts {
            assert_eq!(t.as_deref(), Some(want), "body {}", String::from_utf8_lossy(body));
        }
    }

    const FMT_KEYS: &str = "Invalid request format: need 'rank' and 'keys'";
    const FMT_CONF: &str = "Invalid request format: need 'rank' and 'confirmations'";

    #[test]
    #[rustfmt::skip]
    fn body_level_errors() {
        check_all(b"", "Invalid JSON body: empty body");
        check_all(b" \r\n\t", "Invalid JSON body: empty body");
        check_all(b"[]", "Request body must be a JSON object");
        check_all(b"[{\"rank\":0}]", "Request body must be a JSON object");
        check_all(b"\"x\"", "Request body must be a JSON object");
        check_all(b"1", "Request body must be a JSON object");
        check_all(b"null", "Request body must be a JSON object");
        check_all(b"true", "Request body must be a JSON object");
        check_all(b"{", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"[", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"}", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"{\"rank\":0", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"{\"rank\":0,\"keys\":[\"a\"", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"{\"rank\" 0}", "Invalid JSON body: expected ':' after object key");
        check_all(b"{} x", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"{}{}", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"{\"rank\":0,\"keys\":[]}]", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"{\"a\":tru}", "Invalid JSON body: invalid literal");
        check_all(b"{\"a\":nul}", "Invalid JSON body: invalid literal");
        check_all(b"{\"a\":01}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
        check_all(b"{\"a\":1.}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
        check_all(b"{\"a\":-}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
        check_all(b"{\"a\":NaN}", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"{\"a\":\"\\x\"}", "Invalid JSON body: invalid escape in string");
        check_all(b"{\"a\":\"\\ud800\"}", "Invalid JSON body: invalid escape in string");
        check_all(b"{\"a\":\"\xff\"}", "Invalid JSON body: invalid UTF-8");
        check_all(b"{\"a\":\"\x01\"}", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"{\"a\":\"x}", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"{a:1}", "Invalid JSON body: malformed object");
        check_all(b"{'a':1}", "Invalid JSON body: malformed object");
        check_all(b"{\"a\":1 \"b\":2}", "Invalid JSON body: malformed object");
        check_all(b"{\"a\":1,}", "Invalid JSON body: expected a string object key");
        check_all(b"{\"a\":[1 2]}", "Invalid JSON body: malformed array");
        check_all(b"{\"a\":[1,]}", "Invalid JSON body: malformed or truncated JSON");
        check_all(b"{\"rank\":18446744073709551616}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
        check_all(b"{\"rank\":-9223372036854775809}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
        check_all(b"{\"rank\":99999999999999999999999999,\"keys\":[]}", "Invalid JSON body: invalid number (or integer beyond 64 bits)");
    }

    #[test]
    fn deep_nesting() {
        let deep = |n: usize| {
            let mut b = b"{\"x\":".to_vec();
            b.extend(std::iter::repeat_n(b'[', n));
            b.extend(std::iter::repeat_n(b']', n));
            b.push(b'}');
            b
        };
        // Within simd-json's depth limit the nested value is skipped whole.
        let mut ok = deep(1000);
        assert_eq!(Decoder::default().exists(&mut ok, L), Ok(ExistsBody { keys: vec![] }));
        let mut too_deep = deep(5000);
        let err = Decoder::default().exists(&mut too_deep, L).unwrap_err().to_string();
        assert!(err.starts_with("Invalid JSON body: nesting too deep"), "{err}");
        // A deep prefix_key is skipped item by item.
        let mut b = b"{\"rank\":1,\"keys\":[[\"a\",".to_vec();
        b.extend(std::iter::repeat_n(b'[', 900));
        b.extend(std::iter::repeat_n(b']', 900));
        b.extend(b"],\"b\"]}");
        assert_eq!(Decoder::default().allocate(&mut b, L), Ok(AllocateBody { rank: 1, keys: vec!["a", "b"] }));
    }

    #[test]
    #[rustfmt::skip]
    fn initialize() {
        check_init(br#"{"num_pages":1024,"role":"worker"}"#, Ok((1024, Role::Worker)));
        check_init(br#"{"num_pages":0,"role":"scheduler"}"#, Ok((0, Role::Scheduler)));
        check_init(br#"{"role":"scheduler"}"#, Ok((0, Role::Scheduler)));
        check_init(br#"{"num_pages":7}"#, Ok((7, Role::Worker)));
        check_init(b"{}", Ok((0, Role::Worker)));
        check_init(br#"{"num_pages":-5}"#, Ok((-5, Role::Worker)));
        check_init(br#"{"num_pages":9223372036854775807}"#, Ok((i64::MAX, Role::Worker)));
        check_init(br#"{"num_pages":-9223372036854775808}"#, Ok((i64::MIN, Role::Worker)));
        check_init(br#"{"num_pages":1,"extra":[{"x":[1,2]}],"role":"worker"}"#, Ok((1, Role::Worker)));
        check_init(br#"{"role":"work\u0065r"}"#, Ok((0, Role::Worker)));
        check_init(br#"{"role":"bogus","role":"scheduler"}"#, Ok((0, Role::Scheduler)));
        check_init(br#"{"num_pages":1,"num_pages":2}"#, Ok((2, Role::Worker)));
        check_init(br#"{"num_pages":"x","num_pages":3}"#, Ok((3, Role::Worker)));
        check_init(br#"{"role":"Worker"}"#, Err("Invalid initialization parameters"));
        check_init(br#"{"role":"worker "}"#, Err("Invalid initialization parameters"));
        check_init(br#"{"role":null}"#, Err("Invalid initialization parameters"));
        check_init(br#"{"role":1}"#, Err("Invalid initialization parameters"));
        check_init(br#"{"role":["worker"]}"#, Err("Invalid initialization parameters"));
        check_init(br#"{"role":"scheduler","role":"x"}"#, Err("Invalid initialization parameters"));
        check_init(br#"{"role":"x","num_pages":"y"}"#, Err("Invalid initialization parameters"));
        check_init(br#"{"num_pages":"8"}"#, Err("Invalid field 'num_pages': expected an integer"));
        check_init(br#"{"num_pages":8.0}"#, Err("Invalid field 'num_pages': expected an integer"));
        check_init(br#"{"num_pages":1e3}"#, Err("Invalid field 'num_pages': expected an integer"));
        check_init(br#"{"num_pages":true}"#, Err("Invalid field 'num_pages': expected an integer"));
        check_init(br#"{"num_pages":null}"#, Err("Invalid field 'num_pages': expected an integer"));
        check_init(br#"{"num_pages":[1]}"#, Err("Invalid field 'num_pages': expected an integer"));
        check_init(br#"{"num_pages":{}}"#, Err("Invalid field 'num_pages': expected an integer"));
        check_init(br#"{"num_pages":"x","role":"scheduler"}"#, Err("Invalid field 'num_pages': expected an integer"));
        check_init(br#"{"num_pages":9223372036854775808}"#, Err("Invalid field 'num_pages': integer out of range"));
        check_init(br#"{"num_pages":18446744073709551615}"#, Err("Invalid field 'num_pages': integer out of range"));
    }

    #[test]
    #[rustfmt::skip]
    fn allocate_accepts() {
        check_alloc(br#"{"rank":0,"keys":[["a",""],["b","a"]]}"#, Ok((0, &["a", "b"])));
        check_alloc(br#"{"rank":0,"keys":[]}"#, Ok((0, &[])));
        check_alloc(br#"{"keys":[["a",""]],"rank":3}"#, Ok((3, &["a"])));
        check_alloc(br#" {"rank" : 1 , "keys" : [ [ "a" , "" ] ] } "#, Ok((1, &["a"])));
        check_alloc(br#"{"rank":0,"keys":["a","b"]}"#, Ok((0, &["a", "b"])));
        check_alloc(br#"{"rank":0,"keys":[["a"]]}"#, Ok((0, &["a"])));
        check_alloc(br#"{"rank":0,"keys":[["a","",3,null]]}"#, Ok((0, &["a"])));
        check_alloc(br#"{"rank":0,"keys":[["a",null],["b",5],["c",{"x":[1,{"y":[]}]}],["d",[["e"],[]]],"f"]}"#, Err("Too many keys: 5 > limit 4"));
        check_alloc(br#"{"rank":0,"keys":[["a",null],["b",5],["c",{"x":[1,{"y":[]}]}],["d",[["e"],[]]]]}"#, Ok((0, &["a", "b", "c", "d"])));
        check_alloc(br#"{"rank":0,"keys":[["a",[]],"b",["c",{}]]}"#, Ok((0, &["a", "b", "c"])));
        check_alloc(br#"{"rank":0,"keys":[["a",""],["a",""]]}"#, Ok((0, &["a", "a"])));
        check_alloc(br#"{"rank":-1,"keys":[]}"#, Ok((-1, &[])));
        check_alloc(br#"{"rank":9223372036854775807,"keys":[]}"#, Ok((i64::MAX, &[])));
        check_alloc(br#"{"rank":0,"keys":[],"other":{"keys":5,"rank":null}}"#, Ok((0, &[])));
        check_alloc(br#"{"rank":0,"keys":5,"keys":["z"]}"#, Ok((0, &["z"])));
        check_alloc(br#"{"rank":null,"rank":2,"keys":[]}"#, Ok((2, &[])));
        check_alloc(br#"{"rank":0,"keys":["a\"b","c\\d","\n\t","\u00e9","\ud83e\udd80"]}"#, Err("Too many keys: 5 > limit 4"));
        check_alloc(br#"{"rank":0,"keys":[["a\"b",""],"c\\d",["\n\t"],"\u00e9"]}"#, Ok((0, &["a\"b", "c\\d", "\n\t", "é"])));
        check_alloc(br#"{"rank":0,"keys":["\ud83e\udd80","\u0041/\/"]}"#, Ok((0, &["🦀", "A//"])));
        check_alloc("{\"rank\":0,\"keys\":[\"é✓\"]}".as_bytes(), Ok((0, &["é✓"])));
        check_alloc(br#"{"rank":0,"keys":["12345678"]}"#, Ok((0, &["12345678"])));
    }

    #[test]
    #[rustfmt::skip]
    fn allocate_rejects() {
        check_alloc(br#"{"keys":[]}"#, Err(FMT_KEYS));
        check_alloc(br#"{"rank":null,"keys":[]}"#, Err(FMT_KEYS));
        check_alloc(br#"{"rank":0}"#, Err(FMT_KEYS));
        check_alloc(br#"{"rank":0,"keys":null}"#, Err(FMT_KEYS));
        check_alloc(br#"{"rank":0,"keys":"a"}"#, Err(FMT_KEYS));
        check_alloc(br#"{"rank":0,"keys":{"a":1}}"#, Err(FMT_KEYS));
        check_alloc(br#"{"rank":"x","keys":5}"#, Err(FMT_KEYS));
        check_alloc(br#"{"rank":0,"keys":[],"rank":null}"#, Err(FMT_KEYS));
        check_alloc(br#"{"rank":"0","keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
        check_alloc(br#"{"rank":0.0,"keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
        check_alloc(br#"{"rank":1.5,"keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
        check_alloc(br#"{"rank":false,"keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
        check_alloc(br#"{"rank":[0],"keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
        check_alloc(br#"{"rank":{},"keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
        check_alloc(br#"{"rank":9223372036854775808,"keys":[]}"#, Err("Invalid field 'rank': integer out of range"));
        check_alloc(br#"{"rank":"x","keys":["a","b","c","d","e"]}"#, Err("Invalid field 'rank': expected an integer"));
        check_alloc(br#"{"rank":0,"keys":[5]}"#, Err("Invalid field 'keys': item 0 must be a key string or a [key, prefix_key] pair"));
        check_alloc(br#"{"rank":0,"keys":["a",null]}"#, Err("Invalid field 'keys': item 1 must be a key string or a [key, prefix_key] pair"));
        check_alloc(br#"{"rank":0,"keys":["a",[]]}"#, Err("Invalid field 'keys': item 1 must be a key string or a [key, prefix_key] pair"));
        check_alloc(br#"{"rank":0,"keys":["a",[1,"b"]]}"#, Err("Invalid field 'keys': item 1 must be a key string or a [key, prefix_key] pair"));
        check_alloc(br#"{"rank":0,"keys":["a",[["b"]]]}"#, Err("Invalid field 'keys': item 1 must be a key string or a [key, prefix_key] pair"));
        check_alloc(br#"{"rank":0,"keys":[[[1,2],"x"],"b",{"k":"v"}]}"#, Err("Invalid field 'keys': item 0 must be a key string or a [key, prefix_key] pair"));
        check_alloc(br#"{"rank":0,"keys":[["a",[1,2]],"b",{"k":"v"}]}"#, Err("Invalid field 'keys': item 2 must be a key string or a [key, prefix_key] pair"));
        check_alloc(br#"{"rank":0,"keys":[true]}"#, Err("Invalid field 'keys': item 0 must be a key string or a [key, prefix_key] pair"));
        check_alloc(br#"{"rank":0,"keys":["a",""]}"#, Err("Invalid field 'keys': item 1 is an empty string"));
        check_alloc(br#"{"rank":0,"keys":[["",""]]}"#, Err("Invalid field 'keys': item 0 is an empty string"));
        check_alloc(br#"{"rank":0,"keys":["123456789"]}"#, Err("Key too long: item 0 has 9 bytes > limit 8"));
        check_alloc(br#"{"rank":0,"keys":["a",["\u00e9\u00e9\u00e9\u00e9\u00e9",""]]}"#, Err("Key too long: item 1 has 10 bytes > limit 8"));
        check_alloc(br#"{"rank":0,"keys":["a","b","c","d","e"]}"#, Err("Too many keys: 5 > limit 4"));
        check_alloc(br#"{"rank":0,"keys":[1,2,3,4,5]}"#, Err("Too many keys: 5 > limit 4"));
    }

    #[test]
    #[rustfmt::skip]
    fn confirm_accepts() {
        check_confirm(br#"{"rank":0,"confirmations":[["a",1],["b",2]],"pages_to_release":[3]}"#, Ok((0, &[("a", 1), ("b", 2)], &[3])));
        check_confirm(br#"{"rank":1,"confirmations":[]}"#, Ok((1, &[], &[])));
        check_confirm(br#"{"rank":1}"#, Ok((1, &[], &[])));
        check_confirm(br#"{"rank":1,"pages_to_release":[5,6]}"#, Ok((1, &[], &[5, 6])));
        check_confirm(br#"{"rank":1,"confirmations":[["a",-1]],"pages_to_release":[-2]}"#, Ok((1, &[("a", -1)], &[-2])));
        check_confirm(br#"{"rank":1,"confirmations":[["a",9223372036854775807]],"pages_to_release":[-9223372036854775808]}"#, Ok((1, &[("a", i64::MAX)], &[i64::MIN])));
        check_confirm(br#"{"rank":1,"confirmations":[["a\u0000b",0]]}"#, Ok((1, &[("a\0b", 0)], &[])));
        check_confirm(br#"{"pages_to_release":[1],"confirmations":[["x",2]],"rank":4,"junk":[[[]]]}"#, Ok((4, &[("x", 2)], &[1])));
        check_confirm(br#"{"rank":1,"confirmations":5,"confirmations":[["a",1]]}"#, Ok((1, &[("a", 1)], &[])));
        check_confirm(br#"{"rank":1,"pages_to_release":[1,2,3,4]}"#, Ok((1, &[], &[1, 2, 3, 4])));
        check_confirm(br#"{"rank":1,"confirmations":[["a",1],["a",1]]}"#, Ok((1, &[("a", 1), ("a", 1)], &[])));
    }

    #[test]
    #[rustfmt::skip]
    fn confirm_rejects() {
        check_confirm(br#"{"confirmations":[]}"#, Err(FMT_CONF));
        check_confirm(b"{}", Err(FMT_CONF));
        check_confirm(br#"{"rank":null}"#, Err(FMT_CONF));
        check_confirm(br#"{"rank":0,"confirmations":null}"#, Err(FMT_CONF));
        check_confirm(br#"{"rank":0,"confirmations":{}}"#, Err(FMT_CONF));
        check_confirm(br#"{"rank":0,"confirmations":"a"}"#, Err(FMT_CONF));
        check_confirm(br#"{"rank":"x","confirmations":7}"#, Err(FMT_CONF));
        check_confirm(br#"{"rank":"x"}"#, Err("Invalid field 'rank': expected an integer"));
        check_confirm(br#"{"rank":2.5,"confirmations":[]}"#, Err("Invalid field 'rank': expected an integer"));
        check_confirm(br#"{"rank":true,"confirmations":[]}"#, Err("Invalid field 'rank': expected an integer"));
        check_confirm(br#"{"rank":9223372036854775808}"#, Err("Invalid field 'rank': integer out of range"));
        check_confirm(br#"{"rank":0,"pages_to_release":null}"#, Err("Invalid field 'pages_to_release': expected a list of integers"));
        check_confirm(br#"{"rank":0,"pages_to_release":5}"#, Err("Invalid field 'pages_to_release': expected a list of integers"));
        check_confirm(br#"{"rank":0,"pages_to_release":{"0":1}}"#, Err("Invalid field 'pages_to_release': expected a list of integers"));
        check_confirm(br#"{"rank":0,"pages_to_release":[1,"2"]}"#, Err("Invalid field 'pages_to_release': item 1 must be an integer"));
        check_confirm(br#"{"rank":0,"pages_to_release":[1.0]}"#, Err("Invalid field 'pages_to_release': item 0 must be an integer"));
        check_confirm(br#"{"rank":0,"pages_to_release":[null]}"#, Err("Invalid field 'pages_to_release': item 0 must be an integer"));
        check_confirm(br#"{"rank":0,"pages_to_release":[[1]]}"#, Err("Invalid field 'pages_to_release': item 0 must be an integer"));
        check_confirm(br#"{"rank":0,"pages_to_release":[{},2]}"#, Err("Invalid field 'pages_to_release': item 0 must be an integer"));
        check_confirm(br#"{"rank":0,"pages_to_release":[0,9223372036854775808]}"#, Err("Invalid field 'pages_to_release': item 1 must be an integer"));
        check_confirm(br#"{"rank":0,"confirmations":["a"]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[["a"]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[[]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[["a",1,2]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[[1,"a"]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[["a",1],["b","2"]]}"#, Err("Invalid field 'confirmations': item 1 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[["a",1.5]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[["a",null]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[["a",[1]]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[["a",{}]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[[["a"],1]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[{"a":1}]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[["a",9223372036854775808]]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
        check_confirm(br#"{"rank":0,"confirmations":[["",1]]}"#, Err("Invalid field 'confirmations': item 0 has an empty key"));
        check_confirm(br#"{"rank":0,"confirmations":[["a",1],["123456789",2]]}"#, Err("Key too long: item 1 has 9 bytes > limit 8"));
        check_confirm(br#"{"rank":0,"confirmations":[["a",1],["b",2],["c",3]],"pages_to_release":[4,5]}"#, Err("Too many items: 5 > limit 4"));
        check_confirm(br#"{"rank":0,"pages_to_release":[1,2,3,4,5]}"#, Err("Too many items: 5 > limit 4"));
        check_confirm(br#"{"rank":0,"confirmations":[1,2,3,4,5]}"#, Err("Too many items: 5 > limit 4"));
        check_confirm(br#"{"rank":0,"confirmations":[5],"pages_to_release":"x"}"#, Err("Invalid field 'pages_to_release': expected a list of integers"));
        check_confirm(br#"{"rank":0,"confirmations":[5],"pages_to_release":["x"]}"#, Err("Invalid field 'confirmations': item 0 must be a [key, page] pair"));
    }

    #[test]
    #[rustfmt::skip]
    fn exists() {
        check_exists(br#"{"keys":["a","b"]}"#, Ok(&["a", "b"]));
        check_exists(br#"{"keys":[]}"#, Ok(&[]));
        check_exists(b"{}", Ok(&[]));
        check_exists(br#"{"rank":"ignored","keys":["a"]}"#, Ok(&["a"]));
        check_exists(br#"{"keys":null,"keys":["a"]}"#, Ok(&["a"]));
        check_exists(br#"{"keys":["a\\b","\"","\/"]}"#, Ok(&["a\\b", "\"", "/"]));
        check_exists(br#"{"keys":null}"#, Err("Invalid keys format"));
        check_exists(br#"{"keys":"a"}"#, Err("Invalid keys format"));
        check_exists(br#"{"keys":{"a":1}}"#, Err("Invalid keys format"));
        check_exists(br#"{"keys":["a"],"keys":3}"#, Err("Invalid keys format"));
        check_exists(br#"{"keys":["a",1]}"#, Err("Invalid field 'keys': item 1 must be a string"));
        check_exists(br#"{"keys":[["a",""]]}"#, Err("Invalid field 'keys': item 0 must be a string"));
        check_exists(br#"{"keys":[null]}"#, Err("Invalid field 'keys': item 0 must be a string"));
        check_exists(br#"{"keys":["a",""]}"#, Err("Invalid field 'keys': item 1 is an empty string"));
        check_exists(br#"{"keys":["a","123456789"]}"#, Err("Key too long: item 1 has 9 bytes > limit 8"));
        check_exists(br#"{"keys":["a","b","c","d","e"]}"#, Err("Too many keys: 5 > limit 4"));
    }

    #[test]
    #[rustfmt::skip]
    fn locations() {
        check_loc(br#"{"rank":2,"keys":["a","b"]}"#, Ok((2, &["a", "b"])));
        check_loc(br#"{"rank":2,"keys":[]}"#, Ok((2, &[])));
        check_loc(br#"{"keys":["x"],"rank":0,"x":{}}"#, Ok((0, &["x"])));
        check_loc(br#"{"rank":0,"keys":["\u00e9"]}"#, Ok((0, &["é"])));
        check_loc(br#"{"keys":[]}"#, Err(FMT_KEYS));
        check_loc(br#"{"rank":null,"keys":[]}"#, Err(FMT_KEYS));
        check_loc(br#"{"rank":0}"#, Err(FMT_KEYS));
        check_loc(br#"{"rank":0,"keys":null}"#, Err(FMT_KEYS));
        check_loc(br#"{"rank":0,"keys":"a"}"#, Err(FMT_KEYS));
        check_loc(br#"{"rank":"0","keys":[]}"#, Err("Invalid field 'rank': expected an integer"));
        check_loc(br#"{"rank":9223372036854775808,"keys":[]}"#, Err("Invalid field 'rank': integer out of range"));
        check_loc(br#"{"rank":0,"keys":[["a",""]]}"#, Err("Invalid field 'keys': item 0 must be a string"));
        check_loc(br#"{"rank":0,"keys":["a",2]}"#, Err("Invalid field 'keys': item 1 must be a string"));
        check_loc(br#"{"rank":0,"keys":[""]}"#, Err("Invalid field 'keys': item 0 is an empty string"));
        check_loc(br#"{"rank":0,"keys":["123456789"]}"#, Err("Key too long: item 0 has 9 bytes > limit 8"));
        check_loc(br#"{"rank":0,"keys":["a","b","c","d","e"]}"#, Err("Too many keys: 5 > limit 4"));
    }

    /// Builds the real connector's allocate body for `n` keys.
    fn hot_allocate_body(n: usize) -> (Vec<u8>, Vec<String>) {
        let keys: Vec<String> = (0..n)
            .map(|i| format!("{:032x}", (i as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)))
            .collect();
        let items: Vec<String> = keys.iter().map(|k| format!("[\"{k}\",\"\"]")).collect();
        (format!("{{\"rank\":0,\"keys\":[{}]}}", items.join(",")).into_bytes(), keys)
    }

    #[test]
    fn hot_path_bodies() {
        let (body, keys) = hot_allocate_body(128);
        assert!((5000..6500).contains(&body.len()), "{}", body.len());
        let mut d = Decoder::default();
        // Twice through one decoder: the reused scratch must give the same answer.
        for _ in 0..2 {
            let mut buf = body.clone();
            let got = d.allocate(&mut buf, BIG).unwrap();
            assert_eq!(got.rank, 0);
            assert_eq!(got.keys, keys.iter().map(String::as_str).collect::<Vec<_>>());
            assert_eq!(got.keys.capacity(), 128);
        }
        let mut exists_body =
            format!("{{\"keys\":[{}]}}", keys.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(","))
                .into_bytes();
        let got = d.exists(&mut exists_body, BIG).unwrap();
        assert_eq!(got.keys, keys.iter().map(String::as_str).collect::<Vec<_>>());
    }

    #[test]
    fn decoder_survives_errors_and_large_bodies() {
        let mut d = Decoder::default();
        assert!(d.allocate(&mut b"{".to_vec(), L).is_err());
        assert!(d.allocate(&mut b"[]".to_vec(), L).is_err());
        let mut large = b"{\"rank\":1,\"keys\":[],\"pad\":\"".to_vec();
        large.extend(std::iter::repeat_n(b'x', RETAIN_LIMIT + 10));
        large.extend(b"\"}");
        assert_eq!(d.allocate(&mut large, L), Ok(AllocateBody { rank: 1, keys: vec![] }));
        assert_eq!(
            d.allocate(&mut br#"{"rank":1,"keys":["k"]}"#.to_vec(), L),
            Ok(AllocateBody { rank: 1, keys: vec!["k"] })
        );
    }

    #[test]
    fn zero_limits() {
        let z = Limits { max_keys: 0, max_key_len: 0 };
        let mut d = Decoder::default();
        assert_eq!(d.exists(&mut br#"{"keys":[]}"#.to_vec(), z), Ok(ExistsBody { keys: vec![] }));
        assert_eq!(d.exists(&mut br#"{"keys":["a"]}"#.to_vec(), z), Err(E::TooManyKeys { count: 1, limit: 0 }));
        let one = Limits { max_keys: 1, max_key_len: 0 };
        assert_eq!(
            d.exists(&mut br#"{"keys":["a"]}"#.to_vec(), one),
            Err(E::KeyTooLong { index: 0, len: 1, limit: 0 })
        );
        assert_eq!(d.exists(&mut br#"{"keys":[""]}"#.to_vec(), one), Err(E::EmptyKey { index: 0 }));
    }

    #[test]
    fn decoder_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Decoder>();
    }

    /// Runs every decoder on a copy of `body`; only panics matter.
    fn run_all(body: &[u8]) {
        let mut d = Decoder::default();
        let limits = Limits { max_keys: 8, max_key_len: 16 };
        let _ = d.initialize(&mut body.to_vec());
        let _ = d.allocate(&mut body.to_vec(), limits);
        let _ = d.confirm(&mut body.to_vec(), limits);
        let _ = d.exists(&mut body.to_vec(), limits);
        let _ = d.locations(&mut body.to_vec(), limits);
    }

    /// A JSON-ish value: real JSON most of the time, with a sprinkling of
    /// near-misses, built from the field names and shapes the decoders look at.
    fn jsonish() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| format!("{f:?}")),
            "\"(worker|scheduler|rank|keys|[a-f0-9]{0,20}|\\\\[nt\"\\\\/u0-9a-fA-F]{0,6}|\u{e9})\"",
            "[0-9eE+\\-.]{1,6}",
        ];
        leaf.prop_recursive(6, 64, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(|v| format!("[{}]", v.join(","))),
                proptest::collection::vec(("(rank|keys|confirmations|pages_to_release|num_pages|role|x)", inner), 0..6)
                    .prop_map(|v| {
                        let fields: Vec<String> = v.into_iter().map(|(k, val)| format!("\"{k}\":{val}")).collect();
                        format!("{{{}}}", fields.join(","))
                    }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn never_panics_on_bytes(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            run_all(&body);
        }

        #[test]
        fn never_panics_on_jsonish(body in jsonish(), cut in any::<prop::sample::Index>(), truncate in any::<bool>()) {
            run_all(body.as_bytes());
            if truncate && !body.is_empty() {
                let at = cut.index(body.len());
                run_all(body.as_bytes().get(..at).unwrap_or_default());
            }
        }

        #[test]
        fn never_panics_on_shaped_bodies(
            rank in jsonish(),
            list in jsonish(),
            field in "(keys|confirmations|pages_to_release)",
        ) {
            run_all(format!("{{\"rank\":{rank},\"{field}\":{list}}}").as_bytes());
            run_all(format!("{{\"num_pages\":{rank},\"role\":{list}}}").as_bytes());
        }

        #[test]
        fn string_keys_round_trip(keys in proptest::collection::vec("[^\u{0}]{1,6}", 0..4)) {
            let mut body = Vec::new();
            body.extend_from_slice(b"{\"keys\":[");
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    body.push(b',');
                }
                super::super::encode::json_str(&mut body, k);
            }
            body.extend_from_slice(b"]}");
            let limits = Limits { max_keys: 4, max_key_len: 64 };
            let got = Decoder::default().exists(&mut body, limits).map(|b| b.keys.iter().map(|s| String::from(*s)).collect::<Vec<_>>());
            prop_assert_eq!(got, Ok(keys));
        }
    }
}
