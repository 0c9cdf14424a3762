//! SGLang HiCache's side of the load: its keys (64 lowercase hex, like its
//! SHA-256 page hashes), its request bodies (`hf3fs-meta-client`'s, as
//! [`Bytes`]) and the setup of one space (`POST /0/initialize`, then stored
//! keys by reserve + confirm). The same bodies drive hf3fs-meta and SGLang's
//! own Python server, so the two can be measured side by side
//! (perf/run.sh --baseline).

use crate::client::{LoadConn, LoadTransport};
use crate::keys::stored_key;
use bytes::Bytes;
use hf3fs_meta_client::sglang as wire;
use rand::Rng;
use std::net::SocketAddr;

/// An SGLang page key: 64 lowercase hex characters.
pub type SgKey = [u8; 64];

/// The rank every SGLang scenario uses (the default namespace, `kv`).
pub const RANK: u32 = 0;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A fresh random key.
pub fn random_key<R: Rng>(rng: &mut R) -> SgKey {
    let mut k = [0u8; 64];
    for half in k.chunks_exact_mut(32) {
        let mut v = rng.r#gen::<u128>();
        for c in half.iter_mut().rev() {
            *c = HEX[(v & 0xf) as usize];
            v >>= 4;
        }
    }
    k
}

/// The i-th key of the stored pool: vLLM's stored key `i` twice over, so
/// that other tools can compute it too.
pub fn stored(i: u64) -> SgKey {
    let mut k = [0u8; 64];
    k[..32].copy_from_slice(&stored_key(i));
    k[32..].copy_from_slice(&stored_key(i ^ 0x5a5a_5a5a));
    k
}

/// `{"keys":["k",...]}`: exists, get_page_indices, delete_keys.
pub fn keys_body<'a>(keys: impl IntoIterator<Item = &'a SgKey>) -> Bytes {
    Bytes::from(wire::keys_body(keys))
}

/// `{"keys":[["k",""],...]}`: reserve_and_allocate_page_indices.
pub fn reserve_body(keys: &[SgKey]) -> Bytes {
    Bytes::from(wire::reserve_body(keys))
}

/// `{"written_keys_to_confirm":[["k",p],...],"pages_to_release":[p,...]}`.
pub fn confirm_body<'a>(written: impl IntoIterator<Item = (&'a SgKey, i64)>, release: &[i64]) -> Bytes {
    Bytes::from(wire::confirm_body(written, release))
}

/// The path of `op` on [`RANK`].
pub fn path(op: &str) -> String {
    wire::path(RANK, op)
}

/// Initializes space `(0, "kv")` with `pages` pages, clears it, and stores
/// `stored` keys of the pool (reserve + confirm, `batch` at a time). Returns
/// Ok(true) when the target answered like an SGLang metadata server (its
/// answers will be validated), Ok(false) when it did not (the ceiling).
pub async fn setup(addr: SocketAddr, pages: u64, stored_keys: u64, batch: usize) -> Result<bool, String> {
    let mut conn = LoadConn::new(addr, LoadTransport::Raw);
    let init = Bytes::from(wire::initialize_body(pages));
    let (status, body) = conn.post(&path(wire::INITIALIZE), &init).await.map_err(|e| format!("initialize: {e}"))?;
    if status != 204 {
        eprintln!(
            "loadgen: POST {} answered {status} {:?} (expected 204): not an SGLang metadata server, setup skipped",
            path(wire::INITIALIZE),
            String::from_utf8_lossy(&body[..body.len().min(80)])
        );
        return Ok(false);
    }
    let (status, body) = conn
        .post(&path(wire::CLEAR), &Bytes::from_static(wire::CLEAR_BODY))
        .await
        .map_err(|e| format!("clear: {e}"))?;
    if status != 204 {
        return Err(format!("clear answered {status}: {}", String::from_utf8_lossy(body)));
    }
    let chunk = batch.clamp(1, 1024) as u64;
    let mut i = 0;
    let mut got = Vec::new();
    while i < stored_keys {
        let n = chunk.min(stored_keys - i);
        let keys: Vec<SgKey> = (i..i + n).map(stored).collect();
        let (status, resp) = conn
            .post(&path(wire::RESERVE), &reserve_body(&keys))
            .await
            .map_err(|e| format!("pre-populate reserve: {e}"))?;
        if status != 200 || wire::reserved_indices(resp, &mut got).is_none() || got.len() != keys.len() {
            return Err(format!("pre-populate reserve answered {status}: {}", String::from_utf8_lossy(resp)));
        }
        if got.iter().any(|&(_, p)| p < 0) {
            return Err(format!(
                "pre-populate: the space ran out of pages (--pages {pages} < --stored {stored_keys}?)"
            ));
        }
        let body = confirm_body(keys.iter().zip(got.iter().map(|&(_, p)| p)), &[]);
        let (status, resp) =
            conn.post(&path(wire::CONFIRM_WRITE), &body).await.map_err(|e| format!("pre-populate confirm: {e}"))?;
        if status != 204 {
            return Err(format!("pre-populate confirm answered {status}: {}", String::from_utf8_lossy(resp)));
        }
        i += n;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_byte_exact() {
        let k = stored(0);
        let ks = format!("\"{}\"", std::str::from_utf8(&k).unwrap());
        assert!(k.iter().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(stored(0), stored(1));
        assert_eq!(&keys_body([&k])[..], format!("{{\"keys\":[{ks}]}}").as_bytes());
        assert_eq!(&reserve_body(&[k, k])[..], format!("{{\"keys\":[[{ks},\"\"],[{ks},\"\"]]}}").as_bytes());
        assert_eq!(
            &confirm_body([(&k, 3)], &[4, 5])[..],
            format!("{{\"written_keys_to_confirm\":[[{ks},3]],\"pages_to_release\":[4,5]}}").as_bytes()
        );
        assert_eq!(path("exists"), "/0/exists");
    }
}
