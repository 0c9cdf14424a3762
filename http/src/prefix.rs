//! `POST /keys/longest_prefix`: how many leading blocks of a prompt (or of
//! a chain of keys) a load would find now, for a cache-aware router
//! (docs/api.md, "Longest prefix").
//!
//! Decode (the chain as keys, or token ids that [`crate::chain`] turns into
//! the engine's key chain), count the leading run on the page spaces the
//! dialect names (the core's [`Store::prefix_keys`]: what `batch_exists`
//! and SGLang's `exists` count, with no lease), encode. One route for both
//! dialects: the body's `dialect` says whose chain and spaces.
//!
//! [`Store::prefix_keys`]: crate::core::Store::prefix_keys

use crate::call::Call;
use crate::chain;
use crate::core::{Digest, KeyRef, Suffix};
use crate::decode::{DecodeError, PrefixChain, PrefixDialect};
use crate::encode;
use crate::reply::Reply;
use hyper::StatusCode;

/// `{key}-k` and `{key}-v` of each bare 64-hex digest of `keys`.
fn split_keys<'a>(keys: &[KeyRef<'a>]) -> Result<Vec<KeyRef<'a>>, DecodeError> {
    let mut out = Vec::with_capacity(keys.len() * 2);
    for (index, k) in keys.iter().enumerate() {
        let KeyRef::Digest(Digest { bytes, suffix: Suffix::NONE }) = *k else {
            return Err(DecodeError::SplitKey { index });
        };
        out.push(KeyRef::Digest(Digest { bytes, suffix: Suffix::K }));
        out.push(KeyRef::Digest(Digest { bytes, suffix: Suffix::V }));
    }
    Ok(out)
}

/// `POST /keys/longest_prefix`.
pub(crate) fn longest_prefix(mut c: Call<'_>) -> Result<Reply, Reply> {
    let (s, body) = (c.scratch, &mut c.body);
    if let Some(keys) = s.decoder.longest_prefix_hex(body, c.limits) {
        // A router's chain of vLLM keys: decoded and probed in one pass.
        let p = c.registry.vllm().prefix_batch(keys);
        let mut out = Vec::with_capacity(48 + p.ranks.len() * 4);
        encode::longest_prefix(&mut out, p.complete, keys.len(), &p.ranks);
        return Ok(Reply::json(StatusCode::OK, out, keys.len()));
    }
    let req = s.decoder.longest_prefix(body, c.limits)?;
    let split = matches!(req.dialect, PrefixDialect::Sglang { split: true, .. });
    // The chain as the keys the engine stores, and how many keys make a block.
    let per_block = if split { 2 } else { 1 };
    let owned;
    let keys: &[KeyRef<'_>] = match (&req.chain, &req.dialect) {
        (PrefixChain::Keys(keys), _) if split => {
            owned = split_keys(keys)?;
            &owned
        }
        (PrefixChain::Keys(keys), _) => keys,
        (PrefixChain::Tokens { ids, block_size }, PrefixDialect::Vllm) => {
            chain::vllm_chain(ids, *block_size, &mut s.text, &mut s.chain);
            &s.chain
        }
        (PrefixChain::Tokens { ids, block_size }, PrefixDialect::Sglang { extra_key, cache_salt, .. }) => {
            let seed = chain::sglang_seed(*extra_key, *cache_salt);
            chain::sglang_chain(ids, *block_size, seed, split, &mut s.text, &mut s.chain);
            &s.chain
        }
    };
    let blocks = keys.len() / per_block;
    let (length, ranks) = match req.dialect {
        PrefixDialect::Vllm => {
            let p = c.registry.vllm().prefix_keys(keys);
            (p.complete, p.ranks)
        }
        PrefixDialect::Sglang { namespace, world_size, .. } => {
            // Space (r, namespace) per TP rank r; each is a store of one rank.
            let mut ranks = Vec::with_capacity(world_size as usize);
            for r in 0..world_size {
                let Some(p) = c.registry.sglang().with(r, namespace, |st| st.prefix_keys(keys)) else {
                    // SGLang's own answer for a space never initialized.
                    let msg =
                        format!("Rank {r} namespace '{namespace}' not initialized. Please call /{r}/initialize first.");
                    return Err(Reply::detail(StatusCode::NOT_FOUND, &msg).keys(blocks));
                };
                ranks.push(p.complete / per_block as u32);
            }
            (ranks.iter().copied().min().unwrap_or(0), ranks)
        }
    };
    let mut out = Vec::with_capacity(48 + ranks.len() * 4);
    encode::longest_prefix(&mut out, length, blocks, &ranks);
    Ok(Reply::json(StatusCode::OK, out, blocks))
}
