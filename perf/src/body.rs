//! Request bodies both generators send (loadgen and soak), written straight
//! into a byte buffer.

use crate::keys::Key;
use bytes::Bytes;
use std::fmt::{Display, Write as _};

/// `fmt::Write` into a byte vector, for `write!` of numbers into a body.
pub struct Wr<'a>(pub &'a mut Vec<u8>);

impl std::fmt::Write for Wr<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Appends `k` as a JSON string (keys are hex: nothing to escape).
pub fn push_key(b: &mut Vec<u8>, k: &Key) {
    b.push(b'"');
    b.extend_from_slice(k);
    b.push(b'"');
}

/// A batch_allocate body as vLLM's connector sends it:
/// `{"rank":R,"keys":[["k",""],...]}`.
pub fn alloc_body(rank: impl Display, keys: &[Key]) -> Bytes {
    let mut b = Vec::with_capacity(64 + 40 * keys.len());
    let _ = write!(Wr(&mut b), "{{\"rank\":{rank},\"keys\":[");
    for (i, k) in keys.iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        b.push(b'[');
        push_key(&mut b, k);
        b.extend_from_slice(b",\"\"]");
    }
    b.extend_from_slice(b"]}");
    Bytes::from(b)
}

/// A batch_exists body `{"keys":[...]}` when `rank` is None, else a
/// get_locations body `{"rank":R,"keys":[...]}`.
pub fn keys_body<'a>(rank: Option<usize>, keys: impl IntoIterator<Item = &'a Key>) -> Bytes {
    let mut b = Vec::with_capacity(64 + 35 * 128);
    match rank {
        Some(r) => {
            let _ = write!(Wr(&mut b), "{{\"rank\":{r},\"keys\":[");
        }
        None => b.extend_from_slice(b"{\"keys\":["),
    }
    for (i, k) in keys.into_iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        push_key(&mut b, k);
    }
    b.extend_from_slice(b"]}");
    Bytes::from(b)
}

/// A confirm_write body:
/// `{"rank":R,"confirmations":[["k",p],...],"pages_to_release":[p,...]}`.
pub fn confirm_body<'a, P: Display, Q: Display>(
    rank: impl Display,
    confirms: impl IntoIterator<Item = (&'a Key, P)>,
    releases: impl IntoIterator<Item = Q>,
) -> Bytes {
    let mut b = Vec::with_capacity(96 + 48 * 128);
    let _ = write!(Wr(&mut b), "{{\"rank\":{rank},\"confirmations\":");
    push_pairs_and_releases(&mut b, confirms, releases, push_key);
    Bytes::from(b)
}

/// The tail both dialects' confirm bodies share:
/// `[["k",p],...],"pages_to_release":[p,...]}`, keys written by `push`.
pub fn push_pairs_and_releases<'a, K: ?Sized + 'a, P: Display, Q: Display>(
    b: &mut Vec<u8>,
    pairs: impl IntoIterator<Item = (&'a K, P)>,
    releases: impl IntoIterator<Item = Q>,
    push: impl Fn(&mut Vec<u8>, &K),
) {
    b.push(b'[');
    for (i, (k, p)) in pairs.into_iter().enumerate() {
        if i > 0 {
            b.push(b',');
        }
        b.push(b'[');
        push(b, k);
        let _ = write!(Wr(b), ",{p}]");
    }
    b.extend_from_slice(b"],\"pages_to_release\":[");
    for (i, p) in releases.into_iter().enumerate() {
        let _ = write!(Wr(b), "{}{p}", if i > 0 { "," } else { "" });
    }
    b.extend_from_slice(b"]}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_byte_exact() {
        let k = *b"0123456789abcdef0123456789abcdef";
        let ks = "\"0123456789abcdef0123456789abcdef\"";
        assert_eq!(&alloc_body(3, &[k])[..], format!("{{\"rank\":3,\"keys\":[[{ks},\"\"]]}}").as_bytes());
        assert_eq!(&keys_body(None, &[k, k])[..], format!("{{\"keys\":[{ks},{ks}]}}").as_bytes());
        assert_eq!(&keys_body(Some(2), [&k])[..], format!("{{\"rank\":2,\"keys\":[{ks}]}}").as_bytes());
        assert_eq!(
            &confirm_body(1, [(&k, 5), (&k, 6)], [7, 8])[..],
            format!("{{\"rank\":1,\"confirmations\":[[{ks},5],[{ks},6]],\"pages_to_release\":[7,8]}}").as_bytes()
        );
        assert_eq!(
            &confirm_body(0, std::iter::empty::<(&Key, u32)>(), [0u32; 0])[..],
            b"{\"rank\":0,\"confirmations\":[],\"pages_to_release\":[]}"
        );
    }
}
