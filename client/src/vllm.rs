//! vLLM's dialect (docs/api.md, "Dialect 1"): the paths, request bodies as
//! the connector writes them, and readers of the answers the tools use.
//!
//! Keys are anything that is bytes (`[u8; 32]` hex keys, `String`s); they
//! are written as JSON strings, escaped only when they need it.

use std::fmt::{Display, Write as _};

use crate::json::{push_key_pairs, push_keys, push_pairs_and_releases, Wr};

pub use crate::json::{alloc_results, exists, locations};

/// `POST /keys/batch_allocate`.
pub const BATCH_ALLOCATE: &str = "/keys/batch_allocate";
/// `POST /keys/confirm_write`.
pub const CONFIRM_WRITE: &str = "/keys/confirm_write";
/// `POST /keys/batch_exists`.
pub const BATCH_EXISTS: &str = "/keys/batch_exists";
/// `POST /keys/get_locations`.
pub const GET_LOCATIONS: &str = "/keys/get_locations";
/// `POST /clear` (its body is not read).
pub const CLEAR: &str = "/clear";

/// `POST /rank/{rank}/initialize`.
pub fn initialize_path(rank: impl Display) -> String {
    format!("/rank/{rank}/initialize")
}

/// A worker's initialize body: `{"num_pages":N,"role":"worker"}`.
pub fn initialize_body(num_pages: impl Display) -> Vec<u8> {
    format!("{{\"num_pages\":{num_pages},\"role\":\"worker\"}}").into_bytes()
}

/// The scheduler's initialize body, which changes nothing: `{"role":"scheduler"}`.
pub const SCHEDULER_INITIALIZE_BODY: &[u8] = b"{\"role\":\"scheduler\"}";

/// A batch_allocate body: `{"rank":R,"keys":[["k",""],...]}`.
pub fn allocate_body<K: AsRef<[u8]>>(rank: impl Display, keys: impl IntoIterator<Item = K>) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + 40 * 128);
    let _ = write!(Wr(&mut b), "{{\"rank\":{rank},\"keys\":");
    push_key_pairs(&mut b, keys);
    b.push(b'}');
    b
}

/// A batch_exists body: `{"keys":[...]}`.
pub fn exists_body<K: AsRef<[u8]>>(keys: impl IntoIterator<Item = K>) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + 35 * 128);
    b.extend_from_slice(b"{\"keys\":");
    push_keys(&mut b, keys);
    b.push(b'}');
    b
}

/// A get_locations body: `{"rank":R,"keys":[...]}`.
pub fn locations_body<K: AsRef<[u8]>>(rank: impl Display, keys: impl IntoIterator<Item = K>) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + 35 * 128);
    let _ = write!(Wr(&mut b), "{{\"rank\":{rank},\"keys\":");
    push_keys(&mut b, keys);
    b.push(b'}');
    b
}

/// A confirm_write body:
/// `{"rank":R,"confirmations":[["k",p],...],"pages_to_release":[p,...]}`.
pub fn confirm_body<K: AsRef<[u8]>, P: Display, Q: Display>(
    rank: impl Display,
    confirms: impl IntoIterator<Item = (K, P)>,
    releases: impl IntoIterator<Item = Q>,
) -> Vec<u8> {
    let mut b = Vec::with_capacity(96 + 48 * 128);
    let _ = write!(Wr(&mut b), "{{\"rank\":{rank},\"confirmations\":");
    push_pairs_and_releases(&mut b, confirms, releases);
    b
}

/// The leading run of `true` in a batch_exists answer: the blocks the
/// scheduler counts as hit.
pub fn leading_run(flags: &[bool]) -> usize {
    flags.iter().take_while(|&&b| b).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_byte_exact() {
        let k = *b"0123456789abcdef0123456789abcdef";
        let ks = "\"0123456789abcdef0123456789abcdef\"";
        assert_eq!(allocate_body(3, [&k]), format!("{{\"rank\":3,\"keys\":[[{ks},\"\"]]}}").as_bytes());
        assert_eq!(exists_body([&k, &k]), format!("{{\"keys\":[{ks},{ks}]}}").as_bytes());
        assert_eq!(locations_body(2, [&k]), format!("{{\"rank\":2,\"keys\":[{ks}]}}").as_bytes());
        assert_eq!(
            confirm_body(1, [(&k, 5), (&k, 6)], [7, 8]),
            format!("{{\"rank\":1,\"confirmations\":[[{ks},5],[{ks},6]],\"pages_to_release\":[7,8]}}").as_bytes()
        );
        assert_eq!(
            confirm_body(0, std::iter::empty::<(&[u8], u32)>(), [0u32; 0]),
            b"{\"rank\":0,\"confirmations\":[],\"pages_to_release\":[]}"
        );
        assert_eq!(initialize_body(8), b"{\"num_pages\":8,\"role\":\"worker\"}");
        assert_eq!(initialize_path(3), "/rank/3/initialize");
    }

    #[test]
    fn keys_that_need_escaping_are_escaped() {
        let b = exists_body(["a\"b\\c\n"]);
        assert_eq!(b, b"{\"keys\":[\"a\\\"b\\\\c\\u000a\"]}");
    }

    #[test]
    fn answers_are_read() {
        let mut r = Vec::new();
        alloc_results(br#"{"rank": 0, "results": [["ab", 3], ["cd",-1]]}"#, &mut r).unwrap();
        assert_eq!(r, vec![(&b"ab"[..], 3), (&b"cd"[..], -1)]);
        let mut e = Vec::new();
        exists(br#"{"exists":[true,true,false,true]}"#, &mut e).unwrap();
        assert_eq!(leading_run(&e), 2);
        let mut l = Vec::new();
        locations(br#"{"locations":[1,null]}"#, &mut l).unwrap();
        assert_eq!(l, vec![Some(1), None]);
    }
}
