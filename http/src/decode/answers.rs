//! Every route that has a fast path, its decoder's answer rendered as text:
//! what the fast path's tests (`fast_tests.rs`) and its fuzz oracle
//! (`fuzz/oracles/src/fast.rs`) compare between a decoder with the fast path
//! and [`Decoder::tape_only`], the oracle. For tests only (hidden from the
//! docs; the server never calls it).

use super::{
    AllocateBody, DecodeError, Decoder, ExistsBody, Limits, LocationsBody, PrefixChain, SpaceConfirmBody,
    SpaceLookupBody,
};
use crate::core::KeyRef;
use std::fmt::Debug;

/// A route's decoder, its answer to a body rendered by [`render`].
pub type AnswerFn = fn(&mut Decoder, &mut [u8], Limits) -> String;

/// Every route with a fast path: its name and its rendered decoder.
pub const ROUTES: [(&str, AnswerFn); 9] = [
    ("exists", exists),
    ("locations", locations),
    ("allocate", allocate),
    ("confirm", |d, b, l| render(d.confirm(b, l).map(|x| (classes(&paired(&x.confirmations)), x)))),
    ("space_keys", |d, b, l| render(d.space_keys(b, l))),
    ("space_lookup", space_lookup),
    ("space_reserve", space_reserve),
    ("space_confirm", space_confirm),
    ("longest_prefix", |d, b, l| render(d.longest_prefix(b, l).map(|x| (chain_classes(&x.chain), x)))),
];

/// A batch-exists body decoded as its handler decodes it: its 32-hex keys'
/// path first ([`Decoder::exists_hex`], the keys rendered as the classified
/// list they stand for), the general one for any other body.
fn exists(d: &mut Decoder, b: &mut [u8], l: Limits) -> String {
    if let Some(hex) = d.exists_hex(&*b, l) {
        let keys: Vec<KeyRef<'_>> = hex.iter().map(|&k| KeyRef::Hex(k)).collect();
        return render(Ok((classes(&keys), ExistsBody { keys })));
    }
    render(d.exists(b, l).map(|x| (classes(&x.keys), x)))
}

/// A batch-allocate body decoded as its handler decodes it (as [`exists`]:
/// [`Decoder::allocate_hex`] first, each key's text the one its digest
/// spells, which is the text the answer repeats).
fn allocate(d: &mut Decoder, b: &mut [u8], l: Limits) -> String {
    if let Some((rank, hex)) = d.allocate_hex(&*b, l) {
        let texts: Vec<String> =
            hex.iter().map(|&k| String::from_utf8_lossy(&crate::core::key::encode_hex32(k)).into_owned()).collect();
        let keys: Vec<&str> = texts.iter().map(String::as_str).collect();
        let parsed: Vec<KeyRef<'_>> = hex.iter().map(|&k| KeyRef::Hex(k)).collect();
        return render(Ok((classes(&parsed), AllocateBody { rank, keys, parsed })));
    }
    render(d.allocate(b, l).map(|x| (classes(&x.parsed), x)))
}

/// A get-locations body decoded as its handler decodes it (as [`exists`]).
fn locations(d: &mut Decoder, b: &mut [u8], l: Limits) -> String {
    if let Some((rank, hex)) = d.locations_hex(&*b, l) {
        let keys: Vec<KeyRef<'_>> = hex.iter().map(|&k| KeyRef::Hex(k)).collect();
        return render(Ok((classes(&keys), LocationsBody { rank, keys })));
    }
    render(d.locations(b, l).map(|x| (classes(&x.keys), x)))
}

/// An SGLang lookup body decoded as its handlers decode it: its digest
/// keys' path first ([`Decoder::space_lookup_digests`]), as [`exists`].
fn space_lookup(d: &mut Decoder, b: &mut [u8], l: Limits) -> String {
    if let Some((digests, namespace)) = d.space_lookup_digests(&*b, l) {
        let keys: Vec<KeyRef<'_>> = digests.iter().map(|&k| KeyRef::Digest(k)).collect();
        return render(Ok((classes(&keys), SpaceLookupBody { keys, namespace })));
    }
    render(d.space_lookup(b, l).map(|x| (classes(&x.keys), x)))
}

/// An SGLang reserve body decoded as its handler decodes it: its digest
/// keys' path first ([`Decoder::space_reserve_digests`]), as [`exists`].
fn space_reserve(d: &mut Decoder, b: &mut [u8], l: Limits) -> String {
    if let Some((digests, namespace)) = d.space_reserve_digests(&*b, l) {
        let keys: Vec<KeyRef<'_>> = digests.iter().map(|&k| KeyRef::Digest(k)).collect();
        return render(Ok((classes(&keys), SpaceLookupBody { keys, namespace })));
    }
    render(d.space_reserve(b, l).map(|x| (classes(&x.keys), x)))
}

/// An SGLang confirm body decoded as its handler decodes it: its digest
/// keys' path first ([`Decoder::space_confirm_digests`]), as [`exists`].
fn space_confirm(d: &mut Decoder, b: &mut [u8], l: Limits) -> String {
    if let Some(x) = d.space_confirm_digests(&*b, l) {
        let confirmations: Vec<(KeyRef<'_>, i64)> =
            x.confirmations.iter().map(|&(k, p)| (KeyRef::Digest(k), p)).collect();
        let releases = x.releases.to_vec();
        let body = SpaceConfirmBody { confirmations, releases, namespace: x.namespace };
        return render(Ok((classes(&paired(&body.confirmations)), body)));
    }
    render(d.space_confirm(b, l).map(|x| (classes(&paired(&x.confirmations)), x)))
}

/// The classes of a longest-prefix chain's keys (none for token ids).
fn chain_classes(chain: &PrefixChain<'_>) -> String {
    match chain {
        PrefixChain::Keys(keys) => classes(keys),
        PrefixChain::Tokens { .. } => String::new(),
    }
}

/// The typed arguments' `Debug`, or `400` and the detail text.
fn render<T: Debug>(r: Result<T, DecodeError>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("400 {e}"),
    }
}

/// Each key's class, which a `KeyRef`'s `Debug` (its text) does not show:
/// `h` 32-hex, `d` digest, `t` text.
fn classes(keys: &[KeyRef<'_>]) -> String {
    keys.iter()
        .map(|k| match k {
            KeyRef::Hex(_) => 'h',
            KeyRef::Digest(_) => 'd',
            KeyRef::Text(_) => 't',
        })
        .collect()
}

/// The keys of `(key, page)` confirmations.
fn paired<'a>(pairs: &[(KeyRef<'a>, i64)]) -> Vec<KeyRef<'a>> {
    pairs.iter().map(|p| p.0).collect()
}
