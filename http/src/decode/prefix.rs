//! The body of `POST /keys/longest_prefix` (docs/api.md): a chain of keys,
//! or the token ids the server turns into the engine's key chain.

use super::tape::{fields, int_field, int_of, lookups, Items};
use super::{fast, DecodeError, Decoder, Input, Limits, MAX_NAMESPACE_LEN};
use crate::core::{KeyRef, DEFAULT_NAMESPACE};
use simd_json::{Node, StaticNode};

/// The largest `block_size` accepted (vLLM's are 16 to a few hundred
/// tokens, SGLang's pages 1 to a few hundred).
pub const MAX_BLOCK_SIZE: i64 = 1 << 20;

/// The most SGLang TP ranks (`world_size`) one query names.
pub const MAX_PREFIX_WORLD: i64 = 1024;

/// Whose key chain and page spaces a query is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrefixDialect<'a> {
    /// vLLM's page space: every rank of the store.
    Vllm,
    /// SGLang's spaces `(rank, namespace)` for rank `0..world_size`.
    Sglang {
        /// The spaces' namespace (default `"kv"`).
        namespace: &'a str,
        /// The TP ranks whose spaces hold a block (1 for an MLA model).
        world_size: u32,
        /// SGLang's `extra_key`, seeding the chain with `cache_salt`.
        extra_key: Option<&'a str>,
        /// SGLang's `cache_salt`.
        cache_salt: Option<&'a str>,
        /// Each block stored as two keys, `<digest>-k` and `<digest>-v`
        /// (SGLang's MHA zero-copy layouts, `page_first` and
        /// `page_first_direct`); a block counts when both are there.
        split: bool,
    },
}

/// The chain a query asks about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrefixChain<'a> {
    /// The keys, in chain order, each classified ([`KeyRef::parse`]).
    Keys(Vec<KeyRef<'a>>),
    /// Token ids whose full blocks of `block_size` the server hashes.
    Tokens {
        /// The prompt's token ids.
        ids: Vec<i64>,
        /// Tokens per block (vLLM's `block_size`, SGLang's `page_size`).
        block_size: usize,
    },
}

/// Body of `POST /keys/longest_prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixBody<'a> {
    /// The chain.
    pub chain: PrefixChain<'a>,
    /// Its dialect.
    pub dialect: PrefixDialect<'a>,
}

/// An optional string field.
fn opt_str<'a>(value: Option<&[Node<'a>]>, field: &'static str) -> Result<Option<&'a str>, DecodeError> {
    match value.and_then(<[_]>::first) {
        None | Some(Node::Static(StaticNode::Null)) => Ok(None),
        Some(Node::String(s)) => Ok(Some(s)),
        Some(_) => Err(DecodeError::ExpectedString { field }),
    }
}

/// An optional boolean field, `false` when absent or null.
fn opt_bool(value: Option<&[Node<'_>]>, field: &'static str) -> Result<bool, DecodeError> {
    match value.and_then(<[_]>::first) {
        None | Some(Node::Static(StaticNode::Null)) => Ok(false),
        Some(Node::Static(StaticNode::Bool(b))) => Ok(*b),
        Some(_) => Err(DecodeError::ExpectedBool { field }),
    }
}

/// An optional integer field within `min..=max`, or `default`.
fn bounded(
    value: Option<&[Node<'_>]>,
    field: &'static str,
    min: i64,
    max: i64,
    default: i64,
) -> Result<i64, DecodeError> {
    let Some(node) = value.and_then(<[_]>::first) else { return Ok(default) };
    let v = int_field(node, field)?;
    if !(min..=max).contains(&v) {
        return Err(DecodeError::OutOfBounds { field, min, max });
    }
    Ok(v)
}

impl Decoder {
    /// `{"keys": [key, ...]}` of vLLM's 32-hex keys and nothing else, each
    /// key as the number its digits spell (one pass, as `batch_exists`'s
    /// [`Self::exists_hex`]); `None` for any other body, which
    /// [`Self::longest_prefix`] decodes (the same chain, classified).
    pub fn longest_prefix_hex<B: Input + ?Sized>(&mut self, body: &B, limits: Limits) -> Option<&[u128]> {
        self.scan(body.bytes(), &fast::PREFIX_KEYS_HEX, limits)?;
        Some(self.scratch.hex())
    }

    /// Decodes `{"keys": [str, ...]}` or `{"token_ids": [int, ...],
    /// "block_size": int}`, with the optional `dialect` (`"vllm"` or
    /// `"sglang"`) and SGLang's `namespace`, `world_size`, `extra_key`,
    /// `cache_salt` and `split_kv`.
    ///
    /// # Errors
    ///
    /// The [`DecodeError`] whose text is the 400 answer's `detail`.
    pub fn longest_prefix<'a, B: Input + ?Sized>(
        &mut self,
        body: &'a mut B,
        limits: Limits,
    ) -> Result<PrefixBody<'a>, DecodeError> {
        // A chain of keys and nothing else: the fast path's scan, as
        // batch_exists's (on that shape the tape walk answers the same).
        if self.scan(body.bytes(), &fast::PREFIX_KEYS, limits).is_some() {
            let body: &'a B = body;
            return self.scratch.finish(body.bytes(), |b| {
                Some(PrefixBody { chain: PrefixChain::Keys(b.lookups()?), dialect: PrefixDialect::Vllm })
            });
        }
        self.parse(B::bytes_mut(body), |tape| {
            let [keys, tokens, block_size, dialect, ns, world, extra_key, cache_salt, split] = fields(
                tape,
                [
                    "keys",
                    "token_ids",
                    "block_size",
                    "dialect",
                    "namespace",
                    "world_size",
                    "extra_key",
                    "cache_salt",
                    "split_kv",
                ],
            )?;
            let sglang = match opt_str(dialect, "dialect")? {
                None | Some("vllm") => false,
                Some("sglang") => true,
                Some(_) => return Err(DecodeError::UnknownDialect),
            };
            // SGLang's fields are checked whatever the dialect: a body is
            // refused or taken whole, never half read.
            let namespace = opt_str(ns, "namespace")?.unwrap_or(DEFAULT_NAMESPACE);
            if namespace.len() > MAX_NAMESPACE_LEN {
                return Err(DecodeError::NamespaceTooLong { len: namespace.len(), limit: MAX_NAMESPACE_LEN });
            }
            let world_size = bounded(world, "world_size", 1, MAX_PREFIX_WORLD, 1)? as u32;
            let extra_key = opt_str(extra_key, "extra_key")?;
            let cache_salt = opt_str(cache_salt, "cache_salt")?;
            let split = opt_bool(split, "split_kv")?;
            let dialect = if sglang {
                PrefixDialect::Sglang { namespace, world_size, extra_key, cache_salt, split }
            } else {
                PrefixDialect::Vllm
            };
            let chain = match (keys, tokens) {
                (Some(keys), None) if block_size.is_none() => {
                    let items = Items::of(keys).ok_or(DecodeError::ExpectedList { field: "keys" })?;
                    PrefixChain::Keys(lookups(items, limits)?)
                }
                (None, Some(tokens)) if block_size.is_some() => {
                    let block_size = bounded(block_size, "block_size", 1, MAX_BLOCK_SIZE, 1)? as usize;
                    let items = Items::of(tokens).ok_or(DecodeError::ExpectedList { field: "token_ids" })?;
                    // Only full blocks count; their number is bounded like a key list.
                    let blocks = items.len() / block_size;
                    if blocks > limits.max_keys {
                        return Err(DecodeError::TooManyKeys { count: blocks, limit: limits.max_keys });
                    }
                    let full = blocks * block_size;
                    let mut ids = Vec::with_capacity(full);
                    // Every item is checked, the tail of a partial block too.
                    for (index, item) in items.enumerate() {
                        let id = match item.first() {
                            Some(Node::Static(s)) => int_of(s).ok(),
                            _ => None,
                        };
                        // SGLang hashes token ids as unsigned integers.
                        match id {
                            Some(v) if !sglang || v >= 0 => {
                                if index < full {
                                    ids.push(v);
                                }
                            }
                            _ => return Err(DecodeError::TokenItem { index }),
                        }
                    }
                    PrefixChain::Tokens { ids, block_size }
                }
                _ => return Err(DecodeError::PrefixFormat),
            };
            Ok(PrefixBody { chain, dialect })
        })
    }
}
