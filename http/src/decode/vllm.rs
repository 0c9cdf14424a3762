//! The bodies of vLLM's routes (`/rank/{rank}/initialize`, `/keys/…`).

use super::tape::{check_count, check_key, fields, int_field, int_of, lookups, rank_and_list, Items};
use super::{fast, DecodeError, Decoder, Input, Limits};
use crate::core::KeyRef;
use simd_json::{Node, StaticNode};

/// The role named in an initialize request.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum InitRole {
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
    /// The caller's role; [`InitRole::Worker`] when absent.
    pub role: InitRole,
}

/// Body of `POST /keys/batch_allocate`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocateBody<'a> {
    /// The rank to allocate on.
    pub rank: i64,
    /// The keys, in request order, duplicates kept (the core collapses them).
    /// The `prefix_key` of each `[key, prefix_key]` pair is dropped.
    pub keys: Vec<&'a str>,
    /// The same keys classified ([`KeyRef::parse`]), at the same places.
    pub parsed: Vec<KeyRef<'a>>,
}

/// Body of `POST /keys/confirm_write`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfirmBody<'a> {
    /// The rank the pages belong to.
    pub rank: i64,
    /// `(key, page)` pairs to bind, in request order, each key classified
    /// ([`KeyRef::parse`]). Pages may be negative; the core answers those
    /// as out of range.
    pub confirmations: Vec<(KeyRef<'a>, i64)>,
    /// Pages to free, in request order.
    pub releases: Vec<i64>,
}

/// Body of `POST /keys/batch_exists`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistsBody<'a> {
    /// The keys to look up, in request order, classified
    /// ([`KeyRef::parse`]).
    pub keys: Vec<KeyRef<'a>>,
}

/// Body of `POST /keys/get_locations`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocationsBody<'a> {
    /// The rank whose pages are asked for.
    pub rank: i64,
    /// The keys to locate, in request order, classified.
    pub keys: Vec<KeyRef<'a>>,
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
                None | Some(Node::String("worker")) => InitRole::Worker,
                Some(Node::String("scheduler")) => InitRole::Scheduler,
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
        if let Some(scan) = self.scan(body, &fast::ALLOCATE, limits) {
            return self
                .scratch
                .finish(body, |b| Some(AllocateBody { rank: scan.rank?, keys: b.allocated()?, parsed: b.lookups()? }));
        }
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
            let parsed = out.iter().map(|k| KeyRef::parse(k)).collect();
            Ok(AllocateBody { rank, keys: out, parsed })
        })
    }

    /// The rank and keys of a batch-allocate body whose every key is a
    /// 32-hex digest ([`KeyRef::Hex`]), as [`Self::exists_hex`] gives them;
    /// `None` for any other body, which [`Self::allocate`] decodes.
    pub fn allocate_hex(&mut self, body: &[u8], limits: Limits) -> Option<(i64, &[u128])> {
        let scan = self.scan(body, &fast::ALLOCATE_HEX, limits)?;
        Some((scan.rank?, self.scratch.hex()))
    }

    /// Decodes a confirm-write body,
    /// `{"rank": int, "confirmations": [[key, page], ...], "pages_to_release": [page, ...]}`.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn confirm<'a>(&mut self, body: &'a mut [u8], limits: Limits) -> Result<ConfirmBody<'a>, DecodeError> {
        if let Some(scan) = self.scan(body, &fast::CONFIRM, limits) {
            return self.scratch.finish(body, |b| {
                Some(ConfirmBody { rank: scan.rank?, confirmations: b.confirmations()?, releases: b.releases() })
            });
        }
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
            // Classified once every item is known good (a `_<pool>` suffix
            // interns its pool's name, which a refused body must not do).
            let pairs = pairs.into_iter().map(|(k, p)| (KeyRef::parse(k), p)).collect();
            Ok(ConfirmBody { rank, confirmations: pairs, releases: pages })
        })
    }

    /// Decodes a batch-exists body, `{"keys": [key, ...]}`; no `keys` means
    /// an empty list.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn exists<'a, B: Input + ?Sized>(
        &mut self,
        body: &'a mut B,
        limits: Limits,
    ) -> Result<ExistsBody<'a>, DecodeError> {
        if self.scan(body.bytes(), &fast::EXISTS, limits).is_some() {
            let body: &'a B = body;
            return self.scratch.finish(body.bytes(), |b| Some(ExistsBody { keys: b.lookups()? }));
        }
        self.parse(B::bytes_mut(body), |tape| {
            let [keys] = fields(tape, ["keys"])?;
            let items = match keys {
                None => Items::EMPTY,
                Some(value) => Items::of(value).ok_or(DecodeError::InvalidKeysFormat)?,
            };
            Ok(ExistsBody { keys: lookups(items, limits)? })
        })
    }

    /// The keys of a batch-exists body whose every key is a 32-hex
    /// digest ([`KeyRef::Hex`]), as the numbers they spell, in order:
    /// vLLM's scheduler's body, decoded in one pass with nothing per key
    /// but its digest. `None` for any other body, which [`Self::exists`]
    /// decodes (the same keys, classified: a hex body's answer is the
    /// same either way).
    pub fn exists_hex<B: Input + ?Sized>(&mut self, body: &B, limits: Limits) -> Option<&[u128]> {
        self.scan(body.bytes(), &fast::EXISTS_HEX, limits)?;
        Some(self.scratch.hex())
    }

    /// [`Self::exists_hex`] of a get-locations body: its rank and keys, or
    /// `None` for a body that [`Self::locations`] decodes.
    pub fn locations_hex<B: Input + ?Sized>(&mut self, body: &B, limits: Limits) -> Option<(i64, &[u128])> {
        let scan = self.scan(body.bytes(), &fast::LOCATIONS_HEX, limits)?;
        Some((scan.rank?, self.scratch.hex()))
    }

    /// Decodes a get-locations body, `{"rank": int, "keys": [key, ...]}`.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn locations<'a, B: Input + ?Sized>(
        &mut self,
        body: &'a mut B,
        limits: Limits,
    ) -> Result<LocationsBody<'a>, DecodeError> {
        if let Some(scan) = self.scan(body.bytes(), &fast::LOCATIONS, limits) {
            let body: &'a B = body;
            return self.scratch.finish(body.bytes(), |b| Some(LocationsBody { rank: scan.rank?, keys: b.lookups()? }));
        }
        self.parse(B::bytes_mut(body), |tape| {
            let [rank, keys] = fields(tape, ["rank", "keys"])?;
            let (rank, items) = rank_and_list(rank, keys, "keys")?;
            Ok(LocationsBody { rank, keys: lookups(items, limits)? })
        })
    }
}
