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
//! # The fast path
//!
//! Before simd-json, each hot route (exists, locations, allocate, confirm
//! and SGLang's keys, reserve and confirm bodies) tries a scanner of the
//! exact shapes the real clients send, `fast.rs`: one object of the route's
//! known members, each once; strings of ASCII bytes 0x20–0x7F but `"` and
//! `\`; integers of at most 18 digits; any JSON whitespace between tokens
//! (vLLM's client sends Python's `", "` and `": "`). It decodes straight
//! from the bytes into the same typed arguments, and gives up on anything
//! else (an escape, an unknown or repeated field, a float, a limit reached,
//! a syntax error), so the body then goes to simd-json and every 400 keeps
//! coming from the tape walk. Safe because what it accepts is a subset of
//! JSON on which the tape walk's answer is certain; the proptests in
//! `fast_tests.rs` and the `fast` fuzz target compare both paths on
//! generated, near-valid and arbitrary bodies, simd-json being the oracle.
//! Measured in perf/RESULTS.md ("Decoder fast path").
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
//! # Layout
//!
//! This file holds what every dialect shares: the [`Decoder`] and its
//! scratch, the [`Limits`] and the [`DecodeError`] texts. `input.rs` is the
//! body a decoder reads ([`Body`]: hyper's buffer until it must be
//! written); `fast.rs` is the fast path's scanner, which on the lookup
//! routes also classifies each key (`KeyRef`) while it scans; `tape.rs` walks simd-json's tape (fields, integers,
//! lists of keys); `vllm.rs` decodes the bodies of vLLM's routes,
//! `sglang.rs` those of SGLang HiCache's; the tests live in `tests.rs` and
//! `fast_tests.rs`.
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

// No `unsafe` but in plain.rs (SSE2 intrinsics, each with its SAFETY note).
#![deny(unsafe_code)]

use std::fmt;

use simd_json::{Buffers, ErrorType, Node, Tape};

#[doc(hidden)]
pub mod answers;
mod fast;
mod input;
mod plain;
mod prefix;
mod sglang;
mod tape;
mod vllm;

pub use input::{Body, Input};
pub use prefix::{PrefixBody, PrefixChain, PrefixDialect, MAX_BLOCK_SIZE, MAX_PREFIX_WORLD};
pub use sglang::{SpaceConfirmBody, SpaceConfirmDigests, SpaceInitBody, SpaceKeysBody, SpaceLookupBody};
pub use vllm::{AllocateBody, ConfirmBody, ExistsBody, InitRole, InitializeBody, LocationsBody};

/// Bodies up to this many bytes leave their parse scratch in the [`Decoder`]
/// for the next request; after a larger one the scratch is released.
pub const RETAIN_LIMIT: usize = 256 * 1024;

/// Initial capacity of the parse scratch, enough for a 128-key allocate.
const INITIAL_CAPACITY: usize = 8 * 1024;

/// The longest namespace accepted, in bytes (SGLang's are pool names):
/// here rather than in `sglang.rs` because the fast path checks it too, and
/// the dialect files and `fast.rs` import only this file, never each other.
pub const MAX_NAMESPACE_LEN: usize = 256;

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
    /// SGLang: a required field is absent.
    #[error("Missing field '{field}'")]
    MissingField {
        /// The field's name.
        field: &'static str,
    },
    /// SGLang: a field that must be a list holds something else.
    #[error("Invalid field '{field}': expected a list")]
    ExpectedList {
        /// The field's name.
        field: &'static str,
    },
    /// SGLang: a field that must be a string holds something else.
    #[error("Invalid field '{field}': expected a string")]
    ExpectedString {
        /// The field's name.
        field: &'static str,
    },
    /// Longest prefix: a field that must be a boolean holds something else.
    #[error("Invalid field '{field}': expected a boolean")]
    ExpectedBool {
        /// The field's name.
        field: &'static str,
    },
    /// Longest prefix: with `split_kv`, a key of `keys` that is not a bare
    /// 64-hex digest (its `-k` and `-v` keys are derived from it).
    #[error("Invalid field 'keys': item {index} must be a 64-character lowercase hex digest with 'split_kv'")]
    SplitKey {
        /// Zero-based position in `keys`.
        index: usize,
    },
    /// SGLang: the namespace is longer than the limit.
    #[error("Invalid field 'namespace': {len} bytes > limit {limit}")]
    NamespaceTooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// SGLang confirm: an item of `written_keys_to_confirm` is not a
    /// `[key string, integer]` list of exactly two elements.
    #[error("Invalid field 'written_keys_to_confirm': item {index} must be a [key, page] pair")]
    WrittenKeyItem {
        /// Zero-based position in `written_keys_to_confirm`.
        index: usize,
    },
    /// SGLang confirm: a confirmed key is the empty string.
    #[error("Invalid field 'written_keys_to_confirm': item {index} has an empty key")]
    EmptyWrittenKey {
        /// Zero-based position in `written_keys_to_confirm`.
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
    /// Longest prefix: neither or both of `keys` and `token_ids`, or
    /// `token_ids` without `block_size` (or `block_size` with `keys`).
    #[error("Invalid request format: need 'keys', or 'token_ids' and 'block_size'")]
    PrefixFormat,
    /// Longest prefix: `dialect` is neither `"vllm"` nor `"sglang"`.
    #[error("Invalid field 'dialect': expected \"vllm\" or \"sglang\"")]
    UnknownDialect,
    /// Longest prefix: an integer field outside its bounds.
    #[error("Invalid field '{field}': must be an integer from {min} to {max}")]
    OutOfBounds {
        /// The field's name.
        field: &'static str,
        /// The smallest value accepted.
        min: i64,
        /// The largest value accepted.
        max: i64,
    },
    /// Longest prefix: an item of `token_ids` is not an integer in `i64`
    /// (for SGLang, not a non-negative one).
    #[error("Invalid field 'token_ids': item {index} must be an integer (non-negative for SGLang)")]
    TokenItem {
        /// Zero-based position in `token_ids`.
        index: usize,
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
    /// The fast path's key positions, reused across bodies.
    scratch: fast::Scratch,
    /// Whether the fast path is tried before simd-json.
    fast_path: bool,
}

impl Default for Decoder {
    fn default() -> Self {
        Self {
            buffers: Buffers::new(INITIAL_CAPACITY),
            tape: Tape(Vec::new()),
            scratch: fast::Scratch::default(),
            fast_path: true,
        }
    }
}

impl fmt::Debug for Decoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder").field("tape_capacity", &self.tape.0.capacity()).finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder that never takes the fast path: every body goes to
    /// simd-json. The oracle of the fast path's tests and fuzz target, and
    /// the baseline of its benchmark; the server uses [`Decoder::default`].
    #[must_use]
    pub fn tape_only() -> Self {
        Self { fast_path: false, ..Self::default() }
    }

    /// Runs the fast path's scan over `body` (see `fast.rs`): `Some` when it
    /// recognised the whole body, and then its lists wait in the scratch.
    fn scan(&mut self, body: &[u8], spec: &fast::Spec, limits: Limits) -> Option<fast::Scan> {
        if !self.fast_path {
            return None;
        }
        self.scratch.scan(body, spec, limits)
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

#[cfg(test)]
mod fast_tests;
#[cfg(test)]
mod tests;
