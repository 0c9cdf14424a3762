//! Request bodies both generators send, written straight into a byte buffer.

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
