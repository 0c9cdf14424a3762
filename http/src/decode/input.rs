//! What a decoder reads: a request body that stays hyper's shared buffer
//! while the fast path only reads it, and becomes a private copy the first
//! time something must write it (simd-json unescapes strings in place).
//!
//! A request body usually arrives in one frame, a `Bytes` that shares
//! hyper's read buffer; copying it into a `Vec` for every request cost a
//! `memcpy` of the whole body (8.6 KB for SGLang's 128-key lookups, which
//! this glibc's `rep movsb` makes about 8,600 instructions). The lookup
//! routes (`batch_exists`, `get_locations`, SGLang's `exists` and
//! `get_page_indices`) decode from the shared bytes; the other routes, and
//! any body the fast path hands to simd-json, take the copy.

use bytes::Bytes;

/// A body a decoder can read, and write once it must.
pub trait Input {
    /// The body's bytes.
    fn bytes(&self) -> &[u8];
    /// The body's bytes, writable (a [`Body::Shared`] is copied first).
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl Input for [u8] {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

impl Input for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// A request body as the server read it.
#[derive(Debug)]
pub enum Body<'b> {
    /// One frame, still shared with hyper's buffer.
    Shared(Bytes),
    /// A private copy (several frames, or written since).
    Owned(Vec<u8>),
    /// A caller's buffer (benches, fuzzing, routes without a body).
    Borrowed(&'b mut [u8]),
}

impl Default for Body<'_> {
    fn default() -> Self {
        Body::Owned(Vec::new())
    }
}

impl Input for Body<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Body::Shared(b) => b,
            Body::Owned(v) => v,
            Body::Borrowed(s) => s,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        if let Body::Shared(b) = self {
            *self = Body::Owned(b.to_vec());
        }
        match self {
            // Never: a shared body was just copied.
            Body::Shared(_) => &mut [],
            Body::Owned(v) => v,
            Body::Borrowed(s) => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Decoder, Limits};
    use super::*;

    const LIMITS: Limits = Limits { max_keys: 8, max_key_len: 64 };

    #[test]
    fn lookups_read_a_shared_body_in_place_and_copy_it_only_to_fall_back() {
        let mut d = Decoder::default();
        let mut body = Body::Shared(Bytes::from_static(br#"{"keys":["0123456789abcdef0123456789abcdef","k"]}"#));
        let keys: Vec<String> = d.exists(&mut body, LIMITS).unwrap().keys.iter().map(ToString::to_string).collect();
        assert_eq!(keys, ["0123456789abcdef0123456789abcdef", "k"]);
        assert!(matches!(body, Body::Shared(_)), "the fast path does not copy");
        // An escape: simd-json unescapes in place, on a copy.
        let mut body = Body::Shared(Bytes::from_static(br#"{"rank":0,"keys":["a\u0062"]}"#));
        let keys: Vec<String> = d.locations(&mut body, LIMITS).unwrap().keys.iter().map(ToString::to_string).collect();
        assert_eq!(keys, ["ab"]);
        assert!(matches!(body, Body::Owned(_)));
        let mut body = Body::Shared(Bytes::from_static(br#"{"keys":["x"],"namespace":"n"}"#));
        let got = d.space_lookup(&mut body, LIMITS).map(|b| (b.keys.len(), b.namespace.to_owned()));
        assert_eq!(got, Ok((1, "n".to_owned())));
    }

    #[test]
    fn a_shared_body_is_copied_once_written() {
        let shared = Bytes::from_static(b"{\"keys\":[]}");
        let mut body = Body::Shared(shared.clone());
        assert_eq!(body.bytes(), &shared[..]);
        assert!(matches!(body, Body::Shared(_)), "reading does not copy");
        body.bytes_mut()[0] = b'[';
        assert!(matches!(body, Body::Owned(_)));
        assert_eq!(body.bytes(), b"[\"keys\":[]}");
        assert_eq!(&shared[..], b"{\"keys\":[]}", "hyper's buffer is untouched");
    }
}
