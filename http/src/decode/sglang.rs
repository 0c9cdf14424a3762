//! The bodies of SGLang HiCache's routes (`POST /{rank}/{op}`).
//!
//! Every body is a JSON object with an optional `namespace` string (default
//! `"kv"`). SGLang's own server answers a malformed body with a bare 500,
//! which its client retries three times; here it is a 400 whose `detail`
//! names the field, so the caller fails at once and knows why.
//!
//! Keys are checked like vLLM's (a non-empty string within `--max-key-len`);
//! lists are bounded by `--max-keys`; the namespace by
//! [`MAX_NAMESPACE_LEN`] bytes.

use super::tape::{check_count, check_key, fields, int_field, int_of, key_strings, lookups, Items};
use super::{fast, DecodeError, Decoder, Input, Limits, MAX_NAMESPACE_LEN};
use crate::core::key::Digest;
use crate::core::{KeyRef, DEFAULT_NAMESPACE};
use simd_json::Node;

/// Body of `POST /{rank}/initialize`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpaceInitBody<'a> {
    /// Pages of the space (required; may be 0).
    pub num_pages: i64,
    /// The namespace.
    pub namespace: &'a str,
}

/// Body of `delete_keys`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpaceKeysBody<'a> {
    /// The keys, in request order.
    pub keys: Vec<&'a str>,
    /// The namespace.
    pub namespace: &'a str,
}

/// Body of `exists`, `get_page_indices` and
/// `reserve_and_allocate_page_indices`: [`SpaceKeysBody`] with its keys
/// classified ([`KeyRef::parse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpaceLookupBody<'a> {
    /// The keys, in request order.
    pub keys: Vec<KeyRef<'a>>,
    /// The namespace.
    pub namespace: &'a str,
}

/// Body of `confirm_write`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpaceConfirmBody<'a> {
    /// `(key, page)` pairs to bind (`written_keys_to_confirm`), each key
    /// classified ([`KeyRef::parse`]).
    pub confirmations: Vec<(KeyRef<'a>, i64)>,
    /// Pages to free (`pages_to_release`).
    pub releases: Vec<i64>,
    /// The namespace.
    pub namespace: &'a str,
}

/// A `confirm_write` body whose every key is an SGLang digest
/// ([`Decoder::space_confirm_digests`]): [`SpaceConfirmBody`] with the
/// keys as their digests, lent from the decoder's scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpaceConfirmDigests<'s, 'b> {
    /// `(digest, page)` pairs to bind, in request order.
    pub confirmations: &'s [(Digest, i64)],
    /// Pages to free, in request order.
    pub releases: &'s [i64],
    /// The namespace.
    pub namespace: &'b str,
}

/// The `namespace` field: absent means `"kv"`; anything but a string, or a
/// string too long, is refused.
fn namespace<'a>(value: Option<&[Node<'a>]>) -> Result<&'a str, DecodeError> {
    match value.and_then(<[Node<'a>]>::first) {
        None => Ok(DEFAULT_NAMESPACE),
        Some(Node::String(s)) if s.len() > MAX_NAMESPACE_LEN => {
            Err(DecodeError::NamespaceTooLong { len: s.len(), limit: MAX_NAMESPACE_LEN })
        }
        Some(Node::String(s)) => Ok(s),
        Some(_) => Err(DecodeError::ExpectedString { field: "namespace" }),
    }
}

/// A list field that must be present.
fn required_list<'t, 'a>(value: Option<&'t [Node<'a>]>, field: &'static str) -> Result<Items<'t, 'a>, DecodeError> {
    let value = value.ok_or(DecodeError::MissingField { field })?;
    Items::of(value).ok_or(DecodeError::ExpectedList { field })
}

/// A list field that may be absent (then empty).
fn optional_list<'t, 'a>(value: Option<&'t [Node<'a>]>, field: &'static str) -> Result<Items<'t, 'a>, DecodeError> {
    value.map_or(Ok(Items::EMPTY), |v| Items::of(v).ok_or(DecodeError::ExpectedList { field }))
}

impl Decoder {
    /// Decodes `{"num_pages": int, "namespace"?: str}`.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn space_initialize<'a>(&mut self, body: &'a mut [u8]) -> Result<SpaceInitBody<'a>, DecodeError> {
        self.parse(body, |tape| {
            let [num_pages, ns] = fields(tape, ["num_pages", "namespace"])?;
            let namespace = namespace(ns)?;
            let node =
                num_pages.and_then(<[Node<'a>]>::first).ok_or(DecodeError::MissingField { field: "num_pages" })?;
            Ok(SpaceInitBody { num_pages: int_field(node, "num_pages")?, namespace })
        })
    }

    /// Decodes `{"keys": [str, ...], "namespace"?: str}` (`delete_keys`).
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn space_keys<'a>(&mut self, body: &'a mut [u8], limits: Limits) -> Result<SpaceKeysBody<'a>, DecodeError> {
        if let Some(scan) = self.scan(body, &fast::SPACE_KEYS, limits) {
            return self.scratch.finish(body, |b| {
                Some(SpaceKeysBody { keys: b.keys()?, namespace: b.namespace(&scan, DEFAULT_NAMESPACE)? })
            });
        }
        self.parse(body, |tape| {
            let [keys, ns] = fields(tape, ["keys", "namespace"])?;
            let namespace = namespace(ns)?;
            Ok(SpaceKeysBody { keys: key_strings(required_list(keys, "keys")?, limits)?, namespace })
        })
    }

    /// Decodes `{"keys": [str, ...], "namespace"?: str}` (`exists`,
    /// `get_page_indices`), each key classified.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn space_lookup<'a, B: Input + ?Sized>(
        &mut self,
        body: &'a mut B,
        limits: Limits,
    ) -> Result<SpaceLookupBody<'a>, DecodeError> {
        if let Some(scan) = self.scan(body.bytes(), &fast::SPACE_LOOKUP, limits) {
            let body: &'a B = body;
            return self.scratch.finish(body.bytes(), |b| {
                Some(SpaceLookupBody { keys: b.lookups()?, namespace: b.namespace(&scan, DEFAULT_NAMESPACE)? })
            });
        }
        self.parse(B::bytes_mut(body), |tape| {
            let [keys, ns] = fields(tape, ["keys", "namespace"])?;
            let namespace = namespace(ns)?;
            Ok(SpaceLookupBody { keys: lookups(required_list(keys, "keys")?, limits)?, namespace })
        })
    }

    /// The keys and namespace of an exists or get-page-indices body whose
    /// every key is an SGLang digest, 64 hex digits bare or with `-k`/`-v`
    /// ([`KeyRef::Digest`]), decoded in one pass with nothing per key but
    /// its digest. `None` for any other body, which [`Self::space_lookup`]
    /// decodes (the same keys, classified: a digest body's answer is the
    /// same either way).
    pub fn space_lookup_digests<'s, 'b, B: Input + ?Sized>(
        &'s mut self,
        body: &'b B,
        limits: Limits,
    ) -> Option<(&'s [Digest], &'b str)> {
        let scan = self.scan(body.bytes(), &fast::SPACE_LOOKUP_DIGESTS, limits)?;
        Some((self.scratch.digests(), scan.namespace_in(body.bytes(), DEFAULT_NAMESPACE)?))
    }

    /// Decodes `{"keys": [[key, prefix_key], ...], "namespace"?: str}`
    /// (`reserve_and_allocate_page_indices`), each key classified. A bare
    /// key string is taken as well as a pair; anything after the key in a
    /// pair is skipped unread.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn space_reserve<'a>(
        &mut self,
        body: &'a mut [u8],
        limits: Limits,
    ) -> Result<SpaceLookupBody<'a>, DecodeError> {
        if let Some(scan) = self.scan(body, &fast::SPACE_RESERVE, limits) {
            return self.scratch.finish(body, |b| {
                Some(SpaceLookupBody { keys: b.lookups()?, namespace: b.namespace(&scan, DEFAULT_NAMESPACE)? })
            });
        }
        self.parse(body, |tape| {
            let [keys, ns] = fields(tape, ["keys", "namespace"])?;
            let namespace = namespace(ns)?;
            let items = required_list(keys, "keys")?;
            check_count(&items, limits)?;
            let mut out = Vec::with_capacity(items.len());
            for (index, item) in items.enumerate() {
                let key = match item {
                    [Node::String(key)] => *key,
                    [Node::Array { len, .. }, Node::String(key), ..] if *len > 0 => *key,
                    _ => return Err(DecodeError::KeyItem { index }),
                };
                check_key(key, index, limits, DecodeError::EmptyKey { index })?;
                out.push(KeyRef::parse(key));
            }
            Ok(SpaceLookupBody { keys: out, namespace })
        })
    }

    /// The keys and namespace of a reserve body whose every key is an
    /// SGLang digest, 64 hex digits bare or with `-k`/`-v`, alone or as the
    /// first of a pair (as [`Self::space_reserve`] takes them), decoded in
    /// one pass into their digests from the body as read. `None` for any
    /// other body, which [`Self::space_reserve`] decodes (the same keys,
    /// classified).
    pub fn space_reserve_digests<'s, 'b, B: Input + ?Sized>(
        &'s mut self,
        body: &'b B,
        limits: Limits,
    ) -> Option<(&'s [Digest], &'b str)> {
        let scan = self.scan(body.bytes(), &fast::SPACE_RESERVE_DIGESTS, limits)?;
        Some((self.scratch.digests(), scan.namespace_in(body.bytes(), DEFAULT_NAMESPACE)?))
    }

    /// [`Self::space_reserve_digests`] of a confirm body: its confirmations
    /// with their keys as digests, its releases and its namespace, or
    /// `None` for a body that [`Self::space_confirm`] decodes.
    pub fn space_confirm_digests<'s, 'b, B: Input + ?Sized>(
        &'s mut self,
        body: &'b B,
        limits: Limits,
    ) -> Option<SpaceConfirmDigests<'s, 'b>> {
        let scan = self.scan(body.bytes(), &fast::SPACE_CONFIRM_DIGESTS, limits)?;
        Some(SpaceConfirmDigests {
            confirmations: self.scratch.digest_pairs(),
            releases: self.scratch.released(),
            namespace: scan.namespace_in(body.bytes(), DEFAULT_NAMESPACE)?,
        })
    }

    /// Decodes `{"written_keys_to_confirm"?: [[key, page], ...],
    /// "pages_to_release"?: [page, ...], "namespace"?: str}`.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn space_confirm<'a>(
        &mut self,
        body: &'a mut [u8],
        limits: Limits,
    ) -> Result<SpaceConfirmBody<'a>, DecodeError> {
        if let Some(scan) = self.scan(body, &fast::SPACE_CONFIRM, limits) {
            return self.scratch.finish(body, |b| {
                Some(SpaceConfirmBody {
                    confirmations: b.confirmations()?,
                    releases: b.releases(),
                    namespace: b.namespace(&scan, DEFAULT_NAMESPACE)?,
                })
            });
        }
        self.parse(body, |tape| {
            let [written, releases, ns] = fields(tape, ["written_keys_to_confirm", "pages_to_release", "namespace"])?;
            let namespace = namespace(ns)?;
            let written = optional_list(written, "written_keys_to_confirm")?;
            let releases = releases.map_or(Ok(Items::EMPTY), |v| Items::of(v).ok_or(DecodeError::ReleasesNotList))?;
            let count = written.len().saturating_add(releases.len());
            if count > limits.max_keys {
                return Err(DecodeError::TooManyItems { count, limit: limits.max_keys });
            }
            let mut pairs = Vec::with_capacity(written.len());
            for (index, item) in written.enumerate() {
                let pair = match item {
                    [Node::Array { len: 2, .. }, Node::String(key), Node::Static(page)] => {
                        int_of(page).ok().map(|page| (*key, page))
                    }
                    _ => None,
                };
                let (key, page) = pair.ok_or(DecodeError::WrittenKeyItem { index })?;
                check_key(key, index, limits, DecodeError::EmptyWrittenKey { index })?;
                pairs.push((key, page));
            }
            let mut pages = Vec::with_capacity(releases.len());
            for (index, item) in releases.enumerate() {
                match item {
                    [Node::Static(page)] => pages.push(int_of(page).map_err(|_| DecodeError::ReleaseItem { index })?),
                    _ => return Err(DecodeError::ReleaseItem { index }),
                }
            }
            // Classified once every item is known good (a `_<pool>` suffix
            // interns its pool's name, which a refused body must not do).
            let pairs = pairs.into_iter().map(|(k, p)| (KeyRef::parse(k), p)).collect();
            Ok(SpaceConfirmBody { confirmations: pairs, releases: pages, namespace })
        })
    }

    /// Decodes `{"namespace"?: str}` (`clear`).
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn space_namespace<'a>(&mut self, body: &'a mut [u8]) -> Result<&'a str, DecodeError> {
        self.parse(body, |tape| {
            let [ns] = fields(tape, ["namespace"])?;
            namespace(ns)
        })
    }
}
