//! The engines' key chains, computed from token ids: what
//! `POST /keys/longest_prefix` hashes when a router sends a prompt rather
//! than its keys (docs/api.md, "Longest prefix").
//!
//! - **vLLM** (its HF3FS connector): block `i` of `block_size` tokens is
//!   named `md5(f"{prev}_{ids}")` in lowercase hex, where `prev` is the
//!   previous block's key (`""` for the first block) and `ids` is Python's
//!   `repr` of the block's list of ints (`[1, 2, 3]`: decimal, `", "`
//!   between items, a `-` for a negative id).
//! - **SGLang** (HiCache's storage keys): block `i` of `page_size` tokens
//!   is the SHA-256 of the previous block's 32-byte digest (none for the
//!   first block, unless a namespace seed is given) followed by its token
//!   ids as `u32` little-endian; a block holding an id above `u32::MAX`
//!   is hashed wide instead: the previous digest, one `0xff` byte, then
//!   every id of the block as `u64` little-endian. With SGLang's
//!   `extra_key` or `cache_salt`, the first block's previous digest is
//!   the namespace seed ([`sglang_seed`]).
//!
//! Only full blocks have a key: a trailing partial block is never stored
//! by either engine, so it is never hashed here. Both chains come out as
//! the core's compact keys ([`KeyRef::Hex`], [`KeyRef::Digest`]), the
//! forms a key of the same text sent by a client parses to, without
//! formatting the hex.
//!
//! MD5 is RustCrypto's `md-5`; SHA-256 is ring's, which the TLS layer
//! already builds.

use crate::core::{Digest, KeyRef, Suffix};
use md5::{Digest as _, Md5};
use ring::digest::{Context, SHA256};

/// The text a 32-hex key of all zeros parses to ([`KeyRef::parse`] keeps
/// it as text: the page table reserves the zero key).
const ZERO_HEX: &str = "00000000000000000000000000000000";

/// Lowercase hex digits.
const HEX: &[u8; 16] = b"0123456789abcdef";

/// vLLM's key chain of the full blocks of `ids`, appended to `out`
/// (cleared first). `text` is a scratch buffer for the hashed strings.
pub fn vllm_chain(ids: &[i64], block_size: usize, text: &mut Vec<u8>, out: &mut Vec<KeyRef<'static>>) {
    out.clear();
    if block_size == 0 {
        return;
    }
    let mut prev = [0u8; 32];
    let mut first = true;
    let mut num = itoa::Buffer::new();
    for block in ids.chunks_exact(block_size) {
        text.clear();
        if !first {
            text.extend_from_slice(&prev);
        }
        text.extend_from_slice(b"_[");
        for (i, &id) in block.iter().enumerate() {
            if i > 0 {
                text.extend_from_slice(b", ");
            }
            text.extend_from_slice(num.format(id).as_bytes());
        }
        text.push(b']');
        let digest = md5(text);
        for (i, b) in digest.iter().enumerate() {
            prev[2 * i] = HEX[usize::from(b >> 4)];
            prev[2 * i + 1] = HEX[usize::from(b & 0x0f)];
        }
        first = false;
        let v = u128::from_be_bytes(digest);
        out.push(if v == 0 { KeyRef::Text(ZERO_HEX) } else { KeyRef::Hex(v) });
    }
}

/// SGLang's namespace seed of a chain with `extra_key` or `cache_salt`
/// (its `storage_namespace_seed`): SHA-256 of `sglang-cache-namespace-v1`,
/// then per part a `0x00` byte when absent, or `0x01`, its UTF-8 length as
/// a `u64` little-endian and its bytes. `None` when both are absent (the
/// chain then starts with no previous digest).
pub fn sglang_seed(extra_key: Option<&str>, cache_salt: Option<&str>) -> Option<[u8; 32]> {
    if extra_key.is_none() && cache_salt.is_none() {
        return None;
    }
    let mut ctx = Context::new(&SHA256);
    ctx.update(b"sglang-cache-namespace-v1");
    for part in [extra_key, cache_salt] {
        match part {
            None => ctx.update(&[0]),
            Some(p) => {
                ctx.update(&[1]);
                ctx.update(&(p.len() as u64).to_le_bytes());
                ctx.update(p.as_bytes());
            }
        }
    }
    Some(digest32(ctx))
}

/// SGLang's key chain of the full blocks of `ids` (every id non-negative,
/// as the decoder checks), from `seed`, appended to `out` (cleared first)
/// as bare digests, or, with `split`, as each block's `-k` then `-v` key
/// (its MHA zero-copy layouts). `words` is a scratch buffer.
pub fn sglang_chain(
    ids: &[i64],
    block_size: usize,
    seed: Option<[u8; 32]>,
    split: bool,
    words: &mut Vec<u8>,
    out: &mut Vec<KeyRef<'static>>,
) {
    out.clear();
    if block_size == 0 {
        return;
    }
    let mut prev = seed;
    for block in ids.chunks_exact(block_size) {
        let mut ctx = Context::new(&SHA256);
        if let Some(p) = &prev {
            ctx.update(p);
        }
        words.clear();
        if block.iter().all(|&id| u32::try_from(id).is_ok()) {
            for &id in block {
                words.extend_from_slice(&(id as u32).to_le_bytes());
            }
        } else {
            words.push(0xff);
            for &id in block {
                words.extend_from_slice(&(id as u64).to_le_bytes());
            }
        }
        ctx.update(words);
        let bytes = digest32(ctx);
        prev = Some(bytes);
        if split {
            out.push(KeyRef::Digest(Digest { bytes, suffix: Suffix::K }));
            out.push(KeyRef::Digest(Digest { bytes, suffix: Suffix::V }));
        } else {
            out.push(KeyRef::Digest(Digest { bytes, suffix: Suffix::NONE }));
        }
    }
}

/// The 32 bytes of a finished SHA-256.
fn digest32(ctx: Context) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    bytes.copy_from_slice(ctx.finish().as_ref());
    bytes
}

/// The MD5 digest of `data` (RFC 1321), by RustCrypto's `md-5`.
pub fn md5(data: &[u8]) -> [u8; 16] {
    Md5::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn text(k: &KeyRef<'_>) -> String {
        k.to_string()
    }

    #[test]
    fn md5_matches_the_rfc_vectors() {
        // RFC 1321, appendix A.5, and the padding edges (55, 56, 63, 64 bytes).
        let cases: [(&[u8], &str); 10] = [
            (b"", "d41d8cd98f00b204e9800998ecf8427e"),
            (b"a", "0cc175b9c0f1b6a831c399e269772661"),
            (b"abc", "900150983cd24fb0d6963f7d28e17f72"),
            (b"message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
            (
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "57edf4a22be3c955ac49da2e2107b67a",
            ),
            (&[b'x'; 55], "04364420e25c512fd958a70738aa8f72"),
            (&[b'x'; 56], "668a72d5ba17f08e62dabcafad6db14b"),
            (&[b'x'; 63], "7dc2ca208106a2f703567bdff99d8981"),
            (&[b'x'; 64], "c1bb4f81d892b2d57947682aeb252456"),
            (&[b'x'; 120], "fb98667f98096de92620b64f46e1c5b5"),
        ];
        for (input, want) in cases {
            assert_eq!(hex(&md5(input)), want, "{:?}", String::from_utf8_lossy(input));
        }
    }

    // The fixed vectors below are Python's: vLLM's formula is Python's own
    // `hashlib.md5(f"{prev}_{ids}".encode()).hexdigest()`; SGLang's are
    // `hashlib.sha256` over the bytes its native hash feeds it
    // (tests/python/test_longest_prefix.py checks both chains against the
    // engines' own functions from the pinned wheels).

    #[test]
    fn vllm_chain_is_md5_of_the_previous_key_and_the_list_repr() {
        let (mut text_buf, mut out) = (Vec::new(), Vec::new());
        // Nine ids in blocks of four: the ninth is a partial block, not hashed.
        vllm_chain(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4, &mut text_buf, &mut out);
        let got: Vec<String> = out.iter().map(text).collect();
        assert_eq!(got, ["277eea91ca4b473737090281ef7e3fec", "2475cfddf289f6f8197bb30218808f0b"]);
        // Negative and wide ids print as Python prints them.
        vllm_chain(&[-1, 0, 151643, 1 << 40], 2, &mut text_buf, &mut out);
        let got: Vec<String> = out.iter().map(text).collect();
        assert_eq!(got, ["d6c444d299b0ea299546098180764921", "05961ec08d5554d53ea833cc2d05bddd"]);
        // Each key parses back to the compact key its text would.
        for k in &out {
            let s = k.to_string();
            assert_eq!(*k, KeyRef::parse(&s));
        }
        vllm_chain(&[1, 2, 3], 4, &mut text_buf, &mut out);
        assert!(out.is_empty(), "no full block, no key");
    }

    #[test]
    fn sglang_chain_is_sha256_of_the_previous_digest_and_u32_ids() {
        let (mut words, mut out) = (Vec::new(), Vec::new());
        sglang_chain(&[1, 2, 3, 4, 5], 2, None, false, &mut words, &mut out);
        let got: Vec<String> = out.iter().map(text).collect();
        assert_eq!(
            got,
            [
                "34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f",
                "c57b445f90651b9a650e516ab2238c965b21af35608a31c303e6d9e407f2915c"
            ]
        );
        // A block with an id above u32::MAX is hashed wide; the next one is not.
        sglang_chain(&[7, 1 << 32, 9, 10], 2, None, false, &mut words, &mut out);
        let got: Vec<String> = out.iter().map(text).collect();
        assert_eq!(
            got,
            [
                "c64c295cf84148a3b8a85ab8a0718b8eb669b6d1f1bf4076c7c6785377138061",
                "786e6c52bf00f90f8781ecc069fb364b0cf5501698ff59fdf3709fd6711f0341"
            ]
        );
        for k in &out {
            let s = k.to_string();
            assert_eq!(*k, KeyRef::parse(&s));
        }
    }

    #[test]
    fn sglang_seed_and_split_keys() {
        let hexed = |s: Option<[u8; 32]>| s.map(|b| hex(&b));
        assert_eq!(sglang_seed(None, None), None);
        assert_eq!(
            hexed(sglang_seed(Some("ek"), None)).as_deref(),
            Some("c9b4ebd63c142d8064027806d6975e34556c9f950c474181b255c3fba351995e")
        );
        assert_eq!(
            hexed(sglang_seed(None, Some("salt"))).as_deref(),
            Some("43601f36bb365a5bdb202f3b4398e5edcdc529750311c8aa2028ce19293f8d6e")
        );
        let (mut words, mut out) = (Vec::new(), Vec::new());
        sglang_chain(&[1, 2, 3, 4], 2, sglang_seed(Some("ek"), Some("salt")), true, &mut words, &mut out);
        let got: Vec<String> = out.iter().map(text).collect();
        let a = "ee322feb753a9e1baa64b851ecabdb6af775a2b97b3186e78483ea32d7b17dbb";
        let b = "a33192f3e6dd9fc6238200aa9ddfac9dd738e4ccf6a6703f1cab7581cfb6f54f";
        assert_eq!(got, [format!("{a}-k"), format!("{a}-v"), format!("{b}-k"), format!("{b}-v")]);
    }
}
